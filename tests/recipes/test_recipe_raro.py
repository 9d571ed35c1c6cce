"""RARO end to end through the CLI on a tiny model: its metrics, the replay buffer growing and
saved with the checkpoint, and an exact resume (buffer included); what the step hands the update."""

import dataclasses
import json
import os
import statistics

import pytest
import torch
from recipe_cli import TINY_MODEL, run_cli, stable
from recipe_cli import metric_rows as rows

SETS = [
    *TINY_MODEL,
    "algorithm.name=raro",
    "data.train=reverse",
    "data.val=reverse:test",
    "data.max_prompt_len=400",
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=2",
    "rollout.max_new_tokens=8",
    "raro.critic_samples=2",
    "raro.critic_max_new_tokens=6",
    "raro.replay_capacity=5",
    "sft.steps=25",
    "sft.lr=3e-3",
    "sft.batch_size=16",
    "optim.lr=1e-3",
    "algorithm.kl_coef=0.01",
    "reward.name=rule",
    "trainer.micro_batch_size=4",
    "trainer.progress=false",
    "trainer.seed=3",
]
REVERSE = {"task": "reverse"}  # the final answer is the answer line
CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "grpo.yaml")


def train(out, *extra):
    return run_cli("train", CPU_CONFIG, SETS, f"trainer.output_dir={out}", *extra)


def test_raro_steps_buffer_and_exact_resume(tmp_path, same_checkpoint):
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    assert train(straight, "trainer.total_steps=3", "trainer.save_every=2") == 0
    r = rows(straight)
    for key in (
        "raro/critic_acc",
        "raro/tie_rate",
        "raro/unparseable_rate",
        "raro/policy_reward",
        "raro/buffer_size",
        "raro/replayed_pairs",
        "reward/mean",
        "kl/mean",
        *(f"raro/{role}/{k}" for role in ("policy", "critic") for k in ("loss", "clipfrac", "kl")),
    ):
        assert all(isinstance(x[key], float) for x in r), key
    # 4 fresh triples a step (minus over-length and blank answers), capacity 5; replay after the first step
    judged = [4 - y["raro/masked/policy_overlong"] - y["raro/masked/policy_no_answer"] for y in r]
    assert [x["raro/buffer_size"] for x in r] == [min(5, sum(judged[: i + 1])) for i in range(3)]
    assert r[0]["raro/replayed_pairs"] == 0 and r[1]["raro/replayed_pairs"] > 0
    state = torch.load(os.path.join(straight, "checkpoints", "step_2", "recipe_rank0.pt"), weights_only=False)
    assert len(state["buffer"]["items"]) == r[1]["raro/buffer_size"]
    summary = json.load(open(os.path.join(straight, "summary.json")))
    for key in (
        "val_critic_acc_end",
        "val_policy_reward_end",
        "val_unparseable_rate_end",
        "val_reward_end",
        "val_critic_acc_fixed_end",
        "val_start_policy_reward_end",
    ):
        assert summary[key] is not None, key
    e = summary["eval"]  # each role against the other's start
    assert e["critic_acc_start"] == summary["val_critic_acc_fixed_start"] == summary["val_critic_acc_start"]
    assert e["policy_reward_end"] == summary["val_policy_reward_end"]
    assert e["policy_reward_start"] == summary["val_start_policy_reward_end"]
    assert len(state["start_answers"]) == 4  # the starting policy's held-out answers, kept for resume

    assert train(resumed, "trainer.total_steps=2", "trainer.save_every=2") == 0
    assert train(resumed, "trainer.total_steps=3", "trainer.save_every=2") == 0
    for x, y in zip(r, rows(resumed)):
        assert stable(x) == pytest.approx(stable(y), rel=1e-5, abs=1e-6)
    same_checkpoint(straight, resumed, 3)


def test_warm_start_rows_cut_policy_answers_and_random_critic_labels():
    from types import SimpleNamespace

    from fastcrit.config import RAROConfig
    from fastcrit.recipes.raro import warm_start_rows

    ex = [
        SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())), meta=REVERSE)
        for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")
    ] * 50
    full = warm_start_rows(ex, RAROConfig())
    policy = [r["messages"][-1]["content"] for r in full if r["messages"][0]["content"] == RAROConfig.policy_system]
    assert policy == [e.answer for e in ex]
    critic = [r for r in full if r["messages"][0]["content"] != RAROConfig.policy_system]
    # "expert": the label names the expert's answer
    for r in critic:
        q = r["messages"][1]["content"]
        expert = next(e.answer for e in ex if e.prompt in q)
        assert q.split(f"Answer {r['messages'][-1]['content'][-2]}:\n")[1].startswith(expert)
    cut = warm_start_rows(ex, RAROConfig(warm_start_cut=0.5, warm_start_critic="random"))
    policy = [
        (r["messages"][1]["content"], r["messages"][-1]["content"])
        for r in cut
        if r["messages"][0]["content"] == RAROConfig.policy_system
    ]
    short = [a for q, a in policy if len(a.split()) < 5]
    assert 0.35 < len(short) / len(policy) < 0.65
    assert all(" ".join(reversed(q.split(": ")[1].split())).startswith(a) for q, a in policy)  # prefixes
    labels = [r["messages"][-1]["content"] for r in cut if r["messages"][0]["content"] != RAROConfig.policy_system]
    assert 0.35 < labels.count("[Answer 1]") / len(labels) < 0.65


def test_cut_warm_start_shows_the_critic_the_expert_answer_against_itself_cut_short():
    from types import SimpleNamespace

    from fastcrit.algos.raro import parse_label
    from fastcrit.config import RAROConfig
    from fastcrit.recipes.raro import warm_start_rows

    ex = [
        SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())), meta=REVERSE)
        for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")
    ] * 20
    rows = warm_start_rows(ex, RAROConfig(warm_start_critic="cut", warm_start_cut=0.7))
    critic = [r for r in rows if r["messages"][0]["content"] != RAROConfig.policy_system]
    assert len(critic) == len(ex)
    positions = []
    for r in critic:
        q, label = r["messages"][1]["content"], parse_label(r["messages"][-1]["content"])
        expert = next(e.answer for e in ex if e.prompt in q)
        named = q.split(f"Answer {label}:\n")[1].split("\n")[0]
        other = q.split(f"Answer {3 - label}:\n")[1].split("\n")[0]
        assert named == expert  # the label names the expert's answer
        assert expert.startswith(other + " ") and len(other.split()) < len(expert.split())  # cut short
        positions.append(label)
    assert 0.3 < positions.count(1) / len(positions) < 0.7


def test_warm_start_critic_share_keeps_every_policy_row_and_that_share_of_critic_rows():
    from types import SimpleNamespace

    from fastcrit.config import RAROConfig
    from fastcrit.recipes.raro import warm_start_rows

    ex = [
        SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())), meta=REVERSE)
        for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")
    ] * 100
    rows = warm_start_rows(ex, RAROConfig(warm_start_critic="cut", warm_start_cut=0.7, warm_start_critic_share=0.2))
    policy = [r for r in rows if r["messages"][0]["content"] == RAROConfig.policy_system]
    critic = [r for r in rows if r["messages"][0]["content"] != RAROConfig.policy_system]
    assert len(policy) == len(ex)
    assert 0.14 < len(critic) / len(ex) < 0.26
    # without the share, every question gets a critic row
    full = warm_start_rows(ex, RAROConfig(warm_start_critic="cut", warm_start_cut=0.7))
    assert len([r for r in full if r["messages"][0]["content"] != RAROConfig.policy_system]) == len(ex)
    from fastcrit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"raro.warm_start_critic_share: must be in \(0, 1\]"):
        load_config(None, ["raro.warm_start_critic_share=0"])


@pytest.mark.parametrize("kind, mistaken", [("repeat", "e d c b b"), ("swap", "e d c a b"), ("z", "e d c b z")])
def test_wrong_warm_start_keeps_the_length_and_makes_one_mistake_in_the_same_place(kind, mistaken):
    from types import SimpleNamespace

    from fastcrit.algos.raro import parse_label
    from fastcrit.config import ConfigError, RAROConfig, load_config
    from fastcrit.recipes.raro import warm_start_rows, with_mistake

    assert with_mistake("e d c b a", kind) == mistaken and with_mistake("e", kind) == "e"
    ex = [
        SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())), meta=REVERSE)
        for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")
    ] * 100
    cfg = RAROConfig(warm_start_wrong=0.7, warm_start_mistake=kind, warm_start_critic="wrong")
    rows = warm_start_rows(ex, cfg)
    policy = [r["messages"][-1]["content"] for r in rows if r["messages"][0]["content"] == RAROConfig.policy_system]
    assert len(policy) == len(ex) and all(len(a.split()) == 5 for a in policy)  # the length kept
    wrong = [(a, e.answer) for a, e in zip(policy, ex) if a != e.answer]
    assert 0.6 < len(wrong) / len(ex) < 0.8
    assert all(a == with_mistake(e, kind) and a.split()[:3] == e.split()[:3] for a, e in wrong)  # in the same place
    critic = [r for r in rows if r["messages"][0]["content"] != RAROConfig.policy_system]
    assert len(critic) == len(ex)
    for r in critic:  # the expert's answer against the same with the mistake, the label naming the expert's
        q, label = r["messages"][1]["content"], parse_label(r["messages"][-1]["content"])
        expert = next(e.answer for e in ex if e.prompt in q)
        assert q.split(f"Answer {label}:\n")[1].split("\n")[0] == expert
        assert q.split(f"Answer {3 - label}:\n")[1].split("\n")[0] == with_mistake(expert, kind)
    # a mistake without a share changes nothing; out-of-range shares and unknown kinds name the key
    assert warm_start_rows(ex, RAROConfig(warm_start_mistake=kind)) == warm_start_rows(ex, RAROConfig())
    with pytest.raises(ConfigError, match=r"raro.warm_start_wrong: must be in \[0, 1\]"):
        load_config(None, ["raro.warm_start_wrong=1.5"])
    with pytest.raises(ConfigError, match=r"raro.warm_start_mistake"):
        load_config(None, ["raro.warm_start_mistake=drop"])


@pytest.mark.parametrize("key", ["raro.critic_samples", "rollout.n"])
def test_groups_of_one_are_refused_naming_the_key(key):
    from fastcrit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=rf"^{key}: .*>= 2, got 1"):
        load_config(None, ["algorithm.name=raro", f"{key}=1"])
    load_config(None, ["algorithm.name=grpo", "raro.critic_samples=1"])  # RARO's keys bind RARO only


def forced_verdicts(monkeypatch, pattern):
    """Make the critic's verdicts ``pattern[pair index % len(pattern)][sample]``: "expert" (names the
    expert's answer), "policy" (fooled) or None (unparseable), whatever the tiny critic wrote."""
    from fastcrit.recipes import raro
    from fastcrit.reward import RewardResult

    real = raro.RARO.judge

    def judge(self, pairs, params):
        outs, verdicts, too_long = real(self, pairs, params)
        seen: dict[int, int] = {}
        forced = []
        for o in outs:
            k = seen[o.prompt_index] = seen.get(o.prompt_index, -1) + 1
            pos = pairs[o.prompt_index].expert_pos
            v = pattern[o.prompt_index % len(pattern)][k]
            if v is None:
                forced.append(RewardResult(0.0, {"unparseable": True, "reason": "forced"}))
            else:
                label = pos if v == "expert" else 3 - pos
                forced.append(
                    RewardResult(
                        float(v == "expert"),
                        {"unparseable": False, "label": label, "policy_reward": float(v != "expert")},
                    )
                )
        return outs, forced, too_long

    monkeypatch.setattr(raro.RARO, "judge", judge)


def captured_updates(monkeypatch) -> list:
    """The batches the RARO step hands to ``Run.update`` (copied before the update)."""
    from fastcrit.recipes import scaffold

    seen, real = [], scaffold.Run.update

    def update(self, batch, *args, **kwargs):
        seen.append(
            dataclasses.replace(batch, advantages=batch.advantages.clone(), response_mask=batch.response_mask.clone())
        )
        return real(self, batch, *args, **kwargs)

    monkeypatch.setattr(scaffold.Run, "update", update)
    return seen


def test_masked_rows_neither_train_nor_count_in_their_groups(tmp_path, monkeypatch):
    """Verdicts forced per pair (3 a pair): two naming the expert and one unparseable; one each way
    and one unparseable; all three unparseable (the policy answer is then unjudged). In the batch
    the update gets, masked rows have no valid tokens, and each kept row's advantage is GRPO over
    its group's kept rows alone (the loop below): a group of equal kept verdicts gets 0, with no
    hidden reward for the masked row's score of 0."""
    forced_verdicts(monkeypatch, [("expert", "expert", None), ("expert", "policy", None), (None, None, None)])
    seen = captured_updates(monkeypatch)
    assert train(str(tmp_path / "m"), "trainer.total_steps=2", "trainer.save_every=0", "raro.critic_samples=3") == 0
    assert len(seen) == 2
    equal_kept_groups = 0
    for b in seen:
        kept = (b.response_mask.sum(-1) > 0).tolist()
        scores, groups = b.scores.tolist(), b.group_ids.tolist()
        adv = [
            float(a[m > 0][0]) if k else float(a.abs().sum()) for a, m, k in zip(b.advantages, b.response_mask, kept)
        ]
        want = []
        for i, s in enumerate(scores):
            peers = [scores[j] for j in range(len(scores)) if kept[j] and groups[j] == groups[i]]
            ok = kept[i] and len(peers) >= 2
            want.append((s - statistics.mean(peers)) / (statistics.stdev(peers) + 1e-6) if ok else 0.0)
        assert adv == pytest.approx(want, abs=1e-5)
        for g in set(groups):
            rows = [i for i in range(len(groups)) if groups[i] == g]
            n_kept = sum(kept[i] for i in rows)
            equal_kept_groups += 2 <= n_kept < len(rows) and len({scores[i] for i in rows if kept[i]}) == 1
    assert equal_kept_groups > 0  # the case at stake occurred


# -- what the critic sees ------------------------------------------------------------------------

REASONED = "I take the letters from the end.\nx y z"


def policy_writes(monkeypatch, texts):
    """The policy's samples (the calls with rollout.n = 2 samples a prompt) replaced by ``texts``
    in turn, each ended by EOS; the critic's (3 a pair here) left as sampled."""
    from fastcrit.recipes import scaffold

    real = scaffold.Run.generate

    def generate(self, prompt_ids, params):
        outs = real(self, prompt_ids, params)
        if params.n != 2:
            return outs
        ids = [
            self.tok.encode(texts[i % len(texts)], add_special_tokens=False) + [self.tok.eos_token_id]
            for i in range(len(outs))
        ]
        return [
            dataclasses.replace(o, output_ids=x, logprobs=[-1.0] * len(x), finish_reason="stop")
            for o, x in zip(outs, ids)
        ]

    monkeypatch.setattr(scaffold.Run, "generate", generate)


def judged_pairs(monkeypatch) -> list:
    """The pairs the critic judges in training steps (sampled verdicts; the evaluation's are greedy)."""
    from fastcrit.recipes import raro

    seen, real = [], raro.RARO.judge

    def judge(self, pairs, params):
        if params.n > 1:
            seen.extend(pairs)
        return real(self, pairs, params)

    monkeypatch.setattr(raro.RARO, "judge", judge)
    return seen


@pytest.mark.parametrize("sees", ["answer", "full"])
def test_the_critic_sees_the_final_answer_and_answers_without_one_are_masked(tmp_path, monkeypatch, sees):
    """Policy answers that reason before their answer line show the critic that line alone
    (``raro.critic_sees: answer``, the default; the task `reverse` declares its answer line) or the
    whole text (``full``). An answer with no line to show is masked, counted, and not judged."""
    policy_writes(monkeypatch, [REASONED, REASONED, REASONED, " \n"])
    pairs = judged_pairs(monkeypatch)
    seen = captured_updates(monkeypatch)
    out = str(tmp_path / sees)
    extra = [] if sees == "answer" else ["raro.critic_sees=full"]  # the default, and the other
    assert train(out, "trainer.total_steps=2", "trainer.save_every=0", "raro.critic_samples=3", *extra) == 0
    fresh = [j.answer for j in pairs if j.policy_row is not None]
    want = {"answer": ["x y z"], "full": [REASONED, " \n"]}[sees]
    assert fresh and sorted(set(fresh)) == sorted(want)
    r = rows(out)
    blank = [x["raro/masked/policy_no_answer"] for x in r]
    assert blank == ([1.0, 1.0] if sees == "answer" else [0.0, 0.0])  # 4 answers a step, one blank
    if sees == "answer":
        for b in seen:  # the blank answer's row (the 4th policy row) trains on nothing
            assert b.response_mask[3].sum() == 0


def test_rows_that_declare_no_final_answer_format_are_refused_naming_the_fix():
    from fastcrit.config import ConfigError, RAROConfig
    from fastcrit.data.datasets import Example
    from fastcrit.recipes.raro import shown_answer

    with pytest.raises(
        ConfigError,
        match=r"raro.critic_sees=answer: data.train: a row declares no final-answer "
        r"format; give each row a `task`.*or set raro.critic_sees=full",
    ):
        shown_answer("a\nb", Example("q", "b"), RAROConfig(), "data.train")
    with pytest.raises(ConfigError, match=r"an unknown \('last'\)"):
        shown_answer("a\nb", Example("q", "b", {"answer_format": "last"}), RAROConfig(), "data.train")
    assert shown_answer("a\nb", Example("q", "b", {"answer_format": "line"}), RAROConfig(), "x") == "b"
    assert shown_answer("a\nb", Example("q", "b"), RAROConfig(critic_sees="full"), "x") == "a\nb"


@pytest.mark.parametrize("sees", ["answer", "full"])
def test_warm_start_critic_rows_show_what_the_critic_sees_in_training(sees):
    import re
    from types import SimpleNamespace

    from fastcrit.config import RAROConfig
    from fastcrit.recipes.raro import warm_start_rows

    ex = [
        SimpleNamespace(
            prompt=f"What is {a} + {a}?", answer=f"{a} + {a} = {2 * a}, so \\boxed{{{2 * a}}}", meta={"task": "math"}
        )
        for a in range(1, 9)
    ]
    rows = warm_start_rows(ex, RAROConfig(critic_sees=sees))
    policy = [r["messages"][-1]["content"] for r in rows if r["messages"][0]["content"] == RAROConfig.policy_system]
    assert policy == [e.answer for e in ex]  # the policy still learns the worked answers
    critic = [r["messages"][1]["content"] for r in rows if r["messages"][0]["content"] != RAROConfig.policy_system]
    shown = [a for q in critic for a in re.findall(r"Answer \d:\n(.*?)(?:\n\n|$)", q, re.DOTALL)]
    assert len(critic) == len(ex) and len(shown) == 2 * len(ex)
    if sees == "answer":
        assert all(a.isdigit() for a in shown)  # the boxed results alone
    else:
        assert all(a in {e.answer for e in ex} for a in shown)
