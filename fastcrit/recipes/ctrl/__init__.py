"""CTRL (critique RL with a revising proxy and sandbox tests): its RL step (recipe.py), stage 1's
synthetic critiques (synthesis.py, writer.py), the test-time critique -> revision rounds (rounds.py)
and their evaluation (evaluate.py), and what the stages share (shared.py). Nothing is imported here,
so that loading one stage does not load the others."""
