"""End-to-end GRPO through the CLI on a tiny model: outputs, exact resume, loadable checkpoints."""

import dataclasses
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from fastcrit.cli import main
from tests.recipes.recipe_cli import TINY_MODEL

SETS = [
    *TINY_MODEL,
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=6",
    "sft.steps=3",
    "sft.batch_size=8",
    "optim.lr=1e-3",
    "algorithm.kl_coef=0.01",
    "algorithm.entropy_coef=0.01",
    "trainer.micro_batch_size=3",
    "trainer.progress=false",
    "trainer.seed=3",
]
CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "grpo.yaml")
VOLATILE = ("time/", "throughput/", "memory/")


def train(out, *extra):
    sets = SETS + [f"trainer.output_dir={out}", *extra]
    argv = ["train", CPU_CONFIG]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0


def rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def stable(row):
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def test_run_writes_config_metrics_checkpoints_and_summary(tmp_path):
    out = str(tmp_path / "run")
    train(out, "trainer.total_steps=2", "trainer.save_every=1")
    r = rows(out)
    assert [x["step"] for x in r] == [1, 2]
    for key in (
        "reward/mean",
        "loss/policy",
        "kl/mean",
        "response_len/mean",
        "time/rollout_s",
        "time/reward_s",
        "time/ref_s",
        "time/update_s",
        "time/sync_s",
        "throughput/tokens_per_s",
        "logprob/gap_mean",
        "logprob/gap_max",
    ):
        assert all(isinstance(x[key], float) for x in r), key
    # Memory per phase (CPU: resident set; the peak since the phase began, when Linux lets it be reset).
    peak = "peak" if "memory/update_peak_mb" in r[0] else "process_peak"
    for phase in ("rollout", "reward", "ref", "update", "sync"):
        for x in r:
            current, top = x[f"memory/{phase}_current_mb"], x[f"memory/{phase}_{peak}_mb"]
            assert 1.0 < current <= top < 1e6, (phase, current, top)
    # fp32 native engine: its sampling log-probs are the trainer's up to rounding
    assert all(0 <= x["logprob/gap_mean"] <= x["logprob/gap_max"] < 1e-5 for x in r)
    assert "time/old_logprobs_s" not in r[0]  # auto: no recomputation on fp32 native
    assert os.path.exists(os.path.join(out, "config.yaml"))
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step_1", "step_2"]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["checkpoint"].endswith("step_2") and summary["val_reward_end"] is not None

    # The checkpoint is a plain Hugging Face directory: transformers loads it and generates.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = summary["checkpoint"]
    model = AutoModelForCausalLM.from_pretrained(ckpt, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Reverse the letters: a b c d e"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape[1] > ids.shape[1]
    # ... and its weights are the trained ones, not the initial model's.
    sft = load_file(os.path.join(out, "sft", "final", "model.safetensors"))
    trained = load_file(os.path.join(ckpt, "model.safetensors"))
    assert set(sft) == set(trained)
    assert any(not torch.equal(sft[k], trained[k]) for k in sft)


def test_resume_continues_exactly(tmp_path, same_checkpoint):
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    train(straight, "trainer.total_steps=4", "trainer.save_every=2")
    train(resumed, "trainer.total_steps=2", "trainer.save_every=2")
    with open(os.path.join(resumed, "metrics.jsonl"), "a") as f:  # a step written after the
        f.write(json.dumps({"step": 3, "reward/mean": -1.0}) + "\n")  # checkpoint, then a crash
    train(resumed, "trainer.total_steps=4", "trainer.save_every=2")
    a, b = rows(straight), rows(resumed)
    assert [x["step"] for x in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert stable(x) == pytest.approx(stable(y), rel=1e-6, abs=1e-7)
    same_checkpoint(straight, resumed, 4)


def test_two_processes_train_end_to_end(tmp_path):
    out = str(tmp_path / "two")
    train(out, "trainer.total_steps=2", "trainer.nproc=2", "trainer.save_every=0")
    r = rows(out)
    assert [x["step"] for x in r] == [1, 2]
    assert r[-1]["actor/grad_norm"] > 0
    assert os.path.exists(os.path.join(out, "checkpoints", "step_2", "COMPLETE"))


class ShiftedEngine:
    """The native engine, reporting every sampling log-prob ``shift`` lower than it is: an engine
    whose numbers differ from the trainer's (SGLang's kernels, bf16 rounding) in a known way."""

    def __init__(self, inner, shift: float):
        self.inner, self.shift = inner, shift

    def generate(self, prompts, params):
        return [
            dataclasses.replace(r, logprobs=[x - self.shift for x in r.logprobs])
            for r in self.inner.generate(prompts, params)
        ]

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("recompute", [True, False])
def test_old_logprobs_come_from_the_trainer_or_the_engine(tmp_path, monkeypatch, recompute):
    """One optimizer step per batch, so every ratio is the first mini-batch's: recomputed old
    log-probs make it 1 (nothing clipped, no KL) however far off the engine's are; the engine's
    put the engine's offset into the ratio. The gap metrics see the offset either way."""
    import fastcrit.recipes.scaffold as scaffold

    real = scaffold.make_engine
    monkeypatch.setattr(scaffold, "make_engine", lambda *a, **k: ShiftedEngine(real(*a, **k), 0.05))
    out = str(tmp_path / "run")
    tis = ["algorithm.tis_cap=1.02"] if recompute else []
    train(
        out,
        "trainer.total_steps=1",
        "trainer.save_every=0",
        "algorithm.mini_batches=1",
        f"algorithm.recompute_old_logprobs={str(recompute).lower()}",
        *tis,
    )
    (r,) = rows(out)
    assert r["logprob/gap_mean"] == pytest.approx(0.05, abs=1e-4)
    assert r["logprob/gap_max"] == pytest.approx(0.05, abs=1e-4)
    if recompute:
        assert "time/old_logprobs_s" in r
        # exactly: the update's micro-batches are the recomputation's (trainer.micro_batch_size)
        assert r["actor/clipfrac"] == 0.0 and r["actor/approx_kl"] == 0.0
        # TIS: every token's weight is exp(0.05) = 1.051 > cap, so each is cut to the cap
        assert r["tis/weight_mean"] == pytest.approx(1.02, abs=1e-6) and r["tis/clipped_frac"] == 1.0
    else:
        assert "time/old_logprobs_s" not in r and "tis/weight_mean" not in r
        assert r["actor/approx_kl"] == pytest.approx(-0.05, abs=1e-4)  # mean(old - logp)


def test_forward_only_passes_take_their_own_micro_batch_size(tmp_path, monkeypatch):
    """trainer.logprob_micro_batch_size sizes the reference and old log-prob passes; the update
    keeps trainer.micro_batch_size."""
    import fastcrit.recipes.scaffold as scaffold

    seen, real = [], scaffold.compute_logprobs
    monkeypatch.setattr(
        scaffold, "compute_logprobs", lambda m, b, t, micro, *a: seen.append(micro) or real(m, b, t, micro, *a)
    )
    sizes = []
    real_update = scaffold.update_policy
    monkeypatch.setattr(
        scaffold, "update_policy", lambda *a, **k: sizes.append(k["micro_batch_size"]) or real_update(*a, **k)
    )
    train(
        str(tmp_path / "run"),
        "trainer.total_steps=1",
        "trainer.save_every=0",
        "algorithm.recompute_old_logprobs=true",
        "trainer.logprob_micro_batch_size=5",
    )
    assert seen == [5, 5] and sizes == [3]  # old and reference passes; SETS' micro_batch_size=3


def test_the_demo_model_writes_each_reverse_letter_as_one_token():
    """The reverse task is about order, not spelling: configs/cpu/grpo.yaml's tiny tokenizer must
    write every " x" of a prompt and an answer as one token. The frozen corpus's 512-token
    vocabulary has no " q" (it writes " " + "q"), and the demo learned less on that model
    (docs/LOG.md, 2026-11-28)."""
    import string

    from fastcrit.config import load_config
    from fastcrit.models.tokenizer import default_corpus, train_tokenizer

    cfg = load_config(CPU_CONFIG)
    tok = train_tokenizer(cfg.model.tiny.vocab_size, default_corpus())
    split = [c for c in string.ascii_lowercase if len(tok.encode(" " + c, add_special_tokens=False)) != 1]
    assert split == [], f"model.tiny.vocab_size={cfg.model.tiny.vocab_size}: these letters take two tokens: {split}"
