# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fastcrit-installed

.PHONY: install demo ctrl-demo ctrl-humaneval lint test bench trl-venv clean

install: $(STAMP)

# torch==2.13.0 first: the CPU build lies on this machine's disk; any later range it satisfies
# installs nothing more.
$(STAMP): setup.py kernels/pyproject.toml CMakeLists.txt $(wildcard native/*.c)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: install
	$(BIN)/fastcrit train configs/cpu/grpo.yaml

# CTRL on 2 CPU cores: the tiny coder (generator + proxy), then stage 1 (synthetic critiques), the
# critic's SFT, RL, and test-time rounds on the held-out problems from the generator's greedy answers
# (stage 1 samples its solutions, so that a training problem's three differ).
ctrl-demo: install
	$(BIN)/fastcrit sft configs/cpu/ctrl_coder.yaml
	$(BIN)/fastcrit train configs/cpu/ctrl.yaml
	$(BIN)/fastcrit critique configs/cpu/ctrl.yaml

# After ctrl-demo: HumanEval's 164 problems through the paper's evaluation protocol with its baselines
# (5 solutions per problem, 3 seeds, one critique each; the tiny models solve ~none: it shows that real
# problems flow through every stage and every baseline, nothing more).
ctrl-humaneval: install
	$(BIN)/fastcrit critique configs/cpu/ctrl.yaml --set data.val=humaneval --set data.val_size=164 \
		--set data.max_prompt_len=1024 --set proxy.max_prompt_len=1536 --set ctrl.rounds=1 \
		--set ctrl.eval_solutions=5 --set ctrl.eval_seeds=3 --set ctrl.critique_samples=1 \
		--set ctrl.output=runs/cpu-ctrl/critique_humaneval.jsonl

# ruff (pinned in setup.py's test extra; rules and why each ignore in ruff.toml): the format check,
# then the linter. `make test` runs it first, so CI (.ci/run) fails on either.
lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -ra tests

# Every benchmark, one after another (each also runs alone: python benchmarks/bench_<thing>.py, or
# fastcrit bench PART [--quick]); rows to benchmarks/results/*.csv, report.md, PNGs, the README table
# (a --quick run writes under benchmarks/results/quick/ instead and leaves those alone).
bench: install trl-venv
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/fastcrit bench all

# TRL for bench_trl.py (fastcrit bench e2e), in its own environment: it pins its own versions.
# triton too, the version fastcrit's environment has: Transformers imports torch._dynamo, which
# imports triton wherever it is installed (~70-100 MB of resident memory), as in any CUDA install of
# torch; without it TRL's peak would leave out what fastcrit's includes.
trl-venv: .venv-trl/.installed
.venv-trl/.installed: $(STAMP)
	$(PY) -m venv .venv-trl
	.venv-trl/bin/pip install -q --upgrade pip
	.venv-trl/bin/pip install -q torch==2.13.0
	.venv-trl/bin/pip install -q trl==1.16.0 "triton==$$($(BIN)/python -c 'import triton; print(triton.__version__)')"
	touch $@

clean:
	rm -rf $(VENV) .venv-trl build *.egg-info runs
