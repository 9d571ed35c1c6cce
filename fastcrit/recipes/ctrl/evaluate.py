"""`fastcrit critique CONFIG`: CTRL's test-time evaluation as the paper runs it, with its baselines in
the same table.

For each of ``ctrl.eval_seeds`` seeds (``trainer.seed``, ``+1``, ...): the generator samples
``ctrl.eval_solutions`` solutions per problem at ``ctrl.eval_temperature`` (default
``ctrl.solution_temperature``; the paper samples several), the sandbox runs them, and then

- the critic runs ``ctrl.rounds`` critique -> revision rounds over every solution (sampled as
  ``ctrl.critique_temperature`` / ``critique_top_p`` / ``critique_samples`` say; the reviser is
  greedy), reporting after each round pass@1, pass@k (a problem counts when one of its chains
  passes), Δ↑ and Δ↓ (fixed and broken, as shares of all chains), judgment accuracy and validity;
- the baselines of ``ctrl.baselines`` run one round over the same solutions:
  ``no_critique`` (the reviser gets the same revision conversation with the critique left out: what
  a second look alone gives), ``self_critique`` (the generator critiques its own solution with the
  critic's prompt and sampling, then the reviser revises), ``execution_feedback`` (the reviser is
  told what running the solution showed, the failing test included: an upper bound for a critic
  without tests); ``generator_greedy`` is the generator's greedy answer, once (it has no seed).

Every figure is a mean over the seeds with its standard error (sample standard deviation / sqrt
of the number of seeds; none with one seed). The critic's records go to ``ctrl.output`` (JSONL,
every seed and round); the baselines' beside it (``<name>_baselines.jsonl``); the table to
``<name>_summary.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict

from tqdm import tqdm

from fastcrit.config import Config
from fastcrit.data.ctrl_prompts import feedback_messages, hint_for, no_critique_messages
from fastcrit.recipes.ctrl.rounds import (
    RoundReport,
    critique_protocol,
    critique_round,
    critique_rounds,
    execute,
    format_reports,
    pass_at_k,
    repeat_attempts,
    revise_from,
    round_seed,
    run_revisions,
    sample_solutions,
    tally,
)
from fastcrit.reward import make_reward
from fastcrit.types import is_greedy

BASELINES = ("generator_greedy", "no_critique", "self_critique", "execution_feedback")
LABELS = {
    "generator_greedy": "generator, greedy",
    "generator": "generator (evaluated solutions)",
    "no_critique": "no critique (revise)",
    "self_critique": "self-critique",
    "execution_feedback": "execution feedback",
}


def solution_seed(seed: int) -> int:
    """The initial solutions' sampling seed of an evaluation seed (apart from the critic's)."""
    return seed * 1_000_003 + 7


def baseline_round(name: str, cfg: Config, generator, proxy, reward, attempts, *, seed: int):
    """One round of baseline ``name`` (not generator_greedy) over ``attempts``: (the attempts after
    it, its report, its records)."""
    c, style = cfg.ctrl, cfg.ctrl.prompts
    tokens = cfg.proxy.rollout.max_new_tokens
    if name == "self_critique":
        chains = repeat_attempts(attempts, c.critique_samples)
        return critique_round(
            generator,
            proxy,
            reward,
            chains,
            critic_tokens=cfg.rollout.max_new_tokens,
            generator_tokens=tokens,
            temperature=c.critique_temperature,
            seed=round_seed(seed, 1),
            top_p=c.critique_top_p,
            style=style,
        )
    if name == "no_critique":
        convs = [(i, no_critique_messages(a.problem, a.solution, style)) for i, a in enumerate(attempts)]
    else:
        convs = [
            (
                i,
                feedback_messages(
                    a.problem, a.solution, hint_for(a.problem, a.passed, a.failures, a.failed_tests), style
                ),
            )
            for i, a in enumerate(attempts)
        ]
    sent = revise_from(proxy, convs, max_new_tokens=tokens)
    raw = dict(sent)
    rep = RoundReport(1, 0.0, too_long=len(convs) - len(sent))
    new = tally(rep, attempts, run_revisions(reward, attempts, sent))
    recs = [
        {
            "problem_id": a.problem.id,
            "solution": a.solution,
            "passed_before": a.passed,
            "prompt": convs[i][1][-1]["content"],
            "revision": raw.get(i),
            "passed_after": b.passed,
        }
        for i, (a, b) in enumerate(zip(attempts, new))
    ]
    return new, rep, recs


def greedy_pass_at_1(generator, reward, problems, cfg: Config) -> float:
    """The generator's greedy answer to each problem, run: the share that passes (no seed)."""
    sols = sample_solutions(
        generator,
        problems,
        k=1,
        temperature=0.0,
        max_new_tokens=cfg.proxy.rollout.max_new_tokens,
        seed=0,
        style=cfg.ctrl.prompts,
    )
    greedy = execute(reward, [p for p, _ in sols], [t for _, t in sols])
    return sum(a.passed for a in greedy) / max(len(greedy), 1)


def figures(rep: RoundReport) -> dict[str, float]:
    """What the table shows of one round."""
    m = rep.metrics("")
    keep = ("pass@1", "pass@k", "delta_up", "delta_down", "judgment_acc", "valid_rate")
    return {k: m[k] for k in keep if m.get(k) is not None}


def mean_se(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n
    se = None if n < 2 else math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return {"mean": mean, "se": se, "runs": values}


def combine(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict]:
    """Per method, per figure: mean, standard error and the per-seed values."""
    return {name: {k: mean_se([r[k] for r in rows]) for k in rows[0]} for name, rows in runs.items() if rows}


def format_table(methods: dict[str, dict], k: int) -> list[str]:
    def cell(m: dict, key: str, width: int) -> str:
        if key not in m:
            return " " * width
        v = m[key]
        text = f"{v['mean']:.3f}" + ("" if v["se"] is None else f" ± {v['se']:.3f}")
        return f"{text:<{width}}"

    keys = (
        ("pass@1", "pass@k", "delta_up", "delta_down", "judgment_acc")
        if k > 1
        else ("pass@1", "delta_up", "delta_down", "judgment_acc")
    )  # pass@1 is pass@k with one solution
    heads = {
        "pass@1": "pass@1",
        "pass@k": f"pass@{k}",
        "delta_up": "Δ↑",
        "delta_down": "Δ↓",
        "judgment_acc": "judgment",
    }
    lines = [f"  {'method':34s}" + "".join(f"{heads[key]:17s}" for key in keys) + "valid"]
    for name, m in methods.items():
        label = LABELS.get(name) or (
            f"critic, round {name.rsplit('_', 1)[1]}" if name.startswith("critic_round_") else name
        )
        lines.append((f"  {label:34s}" + "".join(cell(m, key, 17) for key in keys) + cell(m, "valid_rate", 5)).rstrip())
    return lines


def critique_phases(cfg: Config) -> list[str]:
    """The steps of `fastcrit critique`, in order, as its progress bar counts them: the greedy
    baseline once, then per seed the sampled solutions (written and run), the critique rounds,
    and each other baseline."""
    c = cfg.ctrl
    others = [b for b in c.baselines if b != "generator_greedy"]
    steps = ["generator greedy"] if "generator_greedy" in c.baselines else []
    for i in range(c.eval_seeds):
        seed = cfg.trainer.seed + i
        steps += [f"seed {seed}: solutions", f"seed {seed}: {c.rounds} critique round{'s' * (c.rounds != 1)}"]
        steps += [f"seed {seed}: {b}" for b in others]
    return steps


def run_critique(cfg: Config) -> dict:
    """The evaluation (module docstring) on ``data.val``; prints the table and returns the summary."""
    from fastcrit.recipes.ctrl.shared import critic_chat, load_problem_set, make_generator, make_proxy

    c = cfg.ctrl
    out_dir = cfg.trainer.output_dir
    os.makedirs(out_dir, exist_ok=True)
    problems = load_problem_set(
        cfg.data.val, cfg.data.format, limit=cfg.data.val_size, what="data.val", strict=cfg.data.strict
    )
    device = "cpu" if cfg.trainer.device == "cpu" else "cuda"
    proxy = make_proxy(cfg, device)  # the reviser; it also writes the solutions unless ctrl.generator
    writer = make_generator(cfg, device) if c.generator else proxy
    generator_name = proxy.name if writer is proxy else f"{writer.name} (solutions), {proxy.name} (revisions)"
    critic, critic_name = critic_chat(cfg)
    reward = make_reward(cfg, out_dir)
    k, seeds = c.eval_solutions, [cfg.trainer.seed + i for i in range(c.eval_seeds)]
    temperature = c.solution_temperature if c.eval_temperature is None else c.eval_temperature
    runs: dict[str, list[dict]] = {
        "generator_greedy": [],
        "generator": [],
        **{f"critic_round_{r}": [] for r in range(1, c.rounds + 1)},
        **{b: [] for b in c.baselines if b != "generator_greedy"},
    }
    records, baseline_records, first_reports = [], [], None
    tokens = cfg.proxy.rollout.max_new_tokens
    phases = critique_phases(cfg)
    # stderr, as the training bar; disable=None: none when stderr is not a terminal
    bar = tqdm(
        total=len(phases),
        desc="critique",
        unit="step",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None if cfg.trainer.progress else True,
    )
    phase = iter(phases)
    bar.set_postfix_str(next(phase, ""))

    def step() -> None:  # a phase is done: count it, name the next
        bar.update(1)
        bar.set_postfix_str(next(phase, ""))

    try:
        if "generator_greedy" in c.baselines:
            runs["generator_greedy"].append({"pass@1": greedy_pass_at_1(writer, reward, problems, cfg)})
            step()
        for seed in seeds:
            sols = sample_solutions(
                writer,
                problems,
                k=k,
                temperature=temperature,
                max_new_tokens=tokens,
                seed=solution_seed(seed),
                style=c.prompts,
                top_p=c.solution_top_p,
            )
            attempts = execute(reward, [p for p, _ in sols], [t for _, t in sols])
            step()
            reports, recs = critique_rounds(
                critic,
                proxy,
                reward,
                attempts,
                rounds=c.rounds,
                critic_tokens=cfg.rollout.max_new_tokens,
                generator_tokens=tokens,
                temperature=c.critique_temperature,
                samples=c.critique_samples,
                seed=seed,
                top_p=c.critique_top_p,
                style=c.prompts,
                per_problem=k,
            )
            first_reports = first_reports or reports
            records += [dict(r, seed=seed) for r in recs]
            runs["generator"].append({"pass@1": reports[0].pass_at_1, "pass@k": reports[0].pass_at_k})
            for rep in reports[1:]:
                runs[f"critic_round_{rep.round}"].append(figures(rep))
            step()
            for name in c.baselines:
                if name == "generator_greedy":
                    continue
                after, rep, recs = baseline_round(name, cfg, writer, proxy, reward, attempts, seed=seed)
                rep.pass_at_k = pass_at_k(after, k * (c.critique_samples if name == "self_critique" else 1))
                runs[name].append(figures(rep))
                baseline_records += [dict(r, seed=seed, method=name) for r in recs]
                step()
    finally:
        bar.close()
        reward.close()
        proxy.close()
        if writer is not proxy:
            writer.close()
        critic.close()
    methods = combine(runs)
    path = c.output or os.path.join(out_dir, "critique.jsonl")
    _write_jsonl(path, records)
    base_path = os.path.splitext(path)[0] + "_baselines.jsonl"
    _write_jsonl(base_path, baseline_records)
    summary = {
        "problems": len(problems),
        "source": cfg.data.val,
        "critic": critic_name,
        "generator": generator_name,
        "prompts": c.prompts,
        "solutions_per_problem": k,
        "solution_temperature": temperature,
        "seeds": seeds,
        "critique_temperature": c.critique_temperature,
        "critique_top_p": c.critique_top_p,
        "critique_samples": c.critique_samples,
        "methods": methods,
        "rounds": [asdict(r) for r in first_reports],
        "records": path,
        "baseline_records": base_path,
    }
    with open(os.path.splitext(path)[0] + "_summary.json", "w") as f:
        json.dump(summary, f, indent=1)
    how = critique_protocol(c.critique_temperature, c.critique_samples, c.critique_top_p)
    sampled = "greedy" if is_greedy(temperature) else f"temperature {temperature:g}"
    print(
        "\n".join(
            [
                f"critique: {len(problems)} problems from {cfg.data.val}, {k} solution(s) each ({sampled}), "
                f"{len(seeds)} seed(s) (mean ± standard error); critic {critic_name}, {how}; "
                f"generator {generator_name}",
                *format_table(methods, k),
                f"  seed {seeds[0]}, round by round:",
                *format_reports(first_reports),
                f"  every round's texts and verdicts: {path}; the baselines': {base_path}",
            ]
        ),
        flush=True,
    )
    return summary


def _write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
