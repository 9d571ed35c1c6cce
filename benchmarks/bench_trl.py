"""End to end against TRL: fastcrit's GRPO step and TRL's GRPOTrainer on the same setting.

Run alone: ``python benchmarks/bench_trl.py [--quick] [--setting small|large] [--dtype float32|bfloat16]
[--peer-python PATH]``.
TRL runs in its own environment (it pins its own versions): ``make trl-venv`` builds ``.venv-trl``
(torch==2.13.0 CPU, trl==1.16.0, and fastcrit's triton version: Transformers imports
torch._dynamo, which imports triton wherever it is installed, so both processes hold it, as they
would with a CUDA build of torch); ``--peer-python`` or ``FASTCRIT_TRL_PYTHON`` points at another
Python with trl. Without one the script writes no rows and says so in its JSON line.

Both sides, each in a fresh process, the two taking turns (fastcrit first in odd rounds, TRL first
in even ones): the same model directory (configs/cpu/grpo.yaml's tiny Qwen2, or for ``large`` a
13.4M-parameter one of the same family), the shipped ``reverse`` prompts in the chat template with no
system prompt, fastcrit's ``reverse`` reward, 8 prompts x 8 samples per rollout step, the same
max new tokens (12; ``large``: 64), temperature 0.7, top-p 1, no top-k, KL coefficient 0.001
(fastcrit low_var_kl; TRL's beta, k3), lr 3e-4 constant, AdamW (0.9, 0.999, 1e-8, no weight decay),
grad clip 1.0, two optimizer steps per rollout batch (TRL: steps_per_generation=2), token-mean loss
(TRL: loss_type="dapo"), advantages over the group's std, fp32 (``--dtype bfloat16``: bf16 mixed
precision on both sides, fastcrit's ``model.dtype`` and TRL's ``bf16=True``, GRPOConfig's own
default), the same torch thread count.
Not the same: the order the prompts are drawn in (each side's own seeded shuffle); the random
samples (so response lengths differ, and each row reports its side's mean); TRL computes the old
log-probs with an extra forward pass (needed with two updates per batch), fastcrit takes the
engine's (fp32 native: equal up to rounding, as recompute_old_logprobs=auto decides); in ``large``
fastcrit runs each 32-row update batch as two micro-batches of 16 (the same loss and gradient; its
memory knob), TRL as one. TRL runs
twice: as it comes (``trl_grpo_trainer``: GRPOConfig's default gradient_checkpointing=True, which
recomputes each layer's forward in the backward pass to hold less memory) and without it
(``trl_grpo_trainer_no_gc``); fastcrit keeps its activations. fastcrit runs twice too: as it comes
(``fastcrit_grpo``: trainer.share_prompts, a group's prompt run once in the reference and update
passes) and with each sample running its prompt again, as TRL does (``fastcrit_grpo_unshared``).
``--compile`` adds ``fastcrit_grpo_unshared_compiled``: the unshared run with trainer.compile=true
(its rows run whole, so the compiled layers serve every pass); ``compile_s`` is the time torch.compile
took in it, in the first steps, which the medians leave out.

Measured: the wall time of one rollout step (generation, reward, reference, two updates, and for
fastcrit the weight sync into its engine) -- fastcrit's own ``time/step_s``; TRL's from a callback,
the sum of its two optimizer steps -- first ``--warmup`` steps dropped; and each process's peak
resident set, model loading included (both sides run under _peak.py: VmHWM at exit or the RSS
sampled every 2 ms, the larger; fastcrit's phase metrics reset VmHWM, so VmHWM alone is not it).
Rows go to results/bench_trl.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _common import write_rows

from fastcrit.config import load_config

NAME = "trl"
CONFIG = os.path.join(ROOT, "configs", "cpu", "grpo.yaml")
# ``large``: hidden 384, 6 layers, 6 heads (2 KV), MLP 1536, vocab 512: 13.4M parameters.
LARGE = "tiny:hidden=384,layers=6,heads=6,kv_heads=2,intermediate=1536"
# ``large``'s update runs each mini-batch of 32 rows as two micro-batches of 16 (the same loss and
# gradient: token-mean over the mini-batch): fastcrit's memory knob, as gradient checkpointing is
# TRL's; the forward-only passes (reference) keep whole batches.
SETTINGS = {
    "small": {"model": None, "max_new_tokens": 12, "fastcrit": {}},
    "large": {
        "model": LARGE,
        "max_new_tokens": 64,
        "fastcrit": {"trainer.micro_batch_size": 16, "trainer.logprob_micro_batch_size": 64},
    },
}
COMMON = {
    "prompts_per_step": 8,
    "n": 8,
    "updates_per_step": 2,
    "temperature": 0.7,
    "kl_coef": 0.001,
    "lr": 3e-4,
    "grad_clip": 1.0,
    "seed": 0,
}


def peer_python(arg: str | None) -> str | None:
    for cand in (arg, os.environ.get("FASTCRIT_TRL_PYTHON"), os.path.join(ROOT, ".venv-trl", "bin", "python")):
        if cand and os.path.exists(cand):
            return cand
    return None


def triton_version(python: str) -> str:
    """The triton a Python imports ("none" without one): the two sides' peaks compare only when
    both hold it (see the module docstring)."""
    out = subprocess.run([python, "-c", "import triton; print(triton.__version__)"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "none"


def model_dir(spec: str | None) -> str:
    from fastcrit.models.hf import resolve_model_path
    from fastcrit.recipes.common import model_spec

    return resolve_model_path(spec or model_spec(load_config(CONFIG).model))


def run_fastcrit(
    model: str, s: dict, steps: int, threads: int, workdir: str, share: bool = True, compile: bool = False
) -> dict:
    sets = {
        "trainer.share_prompts": str(share).lower(),
        "trainer.compile": str(compile).lower(),
        "model.path": model,
        "model.dtype": s["dtype"],
        "trainer.total_steps": steps,
        "sft.steps": 0,
        "trainer.output_dir": workdir,
        "trainer.save_every": 0,
        "trainer.eval_every": 0,
        "data.val_size": 8,
        "trainer.compute_threads": threads,
        "trainer.progress": "false",
        "rollout.max_new_tokens": s["max_new_tokens"],
        "rollout.n": s["n"],
        "rollout.temperature": s["temperature"],
        "data.prompts_per_step": s["prompts_per_step"],
        "algorithm.kl_coef": s["kl_coef"],
        "algorithm.kl_kind": "low_var_kl",
        "algorithm.loss_agg": "token-mean",
        "algorithm.mini_batches": s["updates_per_step"],
        "optim.lr": s["lr"],
        "optim.grad_clip": s["grad_clip"],
        "trainer.seed": s["seed"],
        **s["fastcrit"],
    }
    cmd = [sys.executable, os.path.join(HERE, "_peak.py"), "-m", "fastcrit.cli", "train", CONFIG]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    peak_file = os.path.join(workdir + "-peak.json")
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "FASTCRIT_PEAK_FILE": peak_file, "OMP_NUM_THREADS": str(threads)},
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench_trl: `fastcrit train` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(peak_file) as f:
        peak = json.load(f)["peak_rss_mb"]
    rows = [r for r in rows if "time/step_s" in r]
    return {
        "step_s": [r["time/step_s"] for r in rows],
        "response_len": [r["response_len/mean"] for r in rows],
        "peak_rss_mb": peak,
        "compile_s": rows[-1].get("compile/time_s", 0.0) if rows else 0.0,
    }


def run_trl(python: str, model: str, s: dict, steps: int, threads: int, workdir: str, gc: bool) -> dict:
    from fastcrit.data.datasets import load_dataset

    data = load_dataset("reverse", "prompt", "answer", "train")
    spec = {
        "model": model,
        "threads": threads,
        "workdir": workdir,
        "settings": {**s, "steps": steps, "gradient_checkpointing": gc},
        "prompts": [e.prompt for e in data.examples],
        "answers": [e.answer for e in data.examples],
    }
    spec_file, out_file = workdir + "-spec.json", workdir + "-out.json"
    with open(spec_file, "w") as f:
        json.dump(spec, f)
    peak_file = workdir + "-peak.json"
    proc = subprocess.run(
        [
            python,
            os.path.join(HERE, "_peak.py"),
            os.path.join(HERE, "_trl_peer.py"),
            "--spec",
            spec_file,
            "--out",
            out_file,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": str(threads), "FASTCRIT_PEAK_FILE": peak_file},
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench_trl: the TRL peer failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(out_file) as f:
        out = json.load(f)
    with open(peak_file) as f:
        out["peak_rss_mb"] = json.load(f)["peak_rss_mb"]
    k = s["updates_per_step"]
    ups = out["update_s"]
    lengths = [float(h["completions/mean_length"]) for h in out["logs"] if "completions/mean_length" in h]
    return {
        "step_s": [sum(ups[i : i + k]) for i in range(0, len(ups) - k + 1, k)],
        "response_len": lengths,
        "peak_rss_mb": out["peak_rss_mb"],
        "trl": out["trl"],
    }


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    import torch

    q = torch.tensor(xs, dtype=torch.float64).quantile(torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64))
    return q[0].item(), q[1].item(), q[2].item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small setting, 1 round of 5 steps")
    ap.add_argument("--setting", choices=[*SETTINGS, "both"], default="both")
    ap.add_argument("--rounds", type=int, default=None, help="fresh-process runs per side (default 3; quick 1)")
    ap.add_argument("--steps", type=int, default=None, help="rollout steps per run (default 8; quick 5)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of each run left out")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="bfloat16: mixed precision on both sides (fastcrit model.dtype, TRL bf16=True)",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also fastcrit_grpo_unshared_compiled: trainer.compile=true (rows run whole: the shared-prompt "
        "passes run the layers eager)",
    )
    ap.add_argument("--peer-python", default=None, help="a Python with trl (default .venv-trl/bin/python)")
    args = ap.parse_args()
    python = peer_python(args.peer_python)
    if python is None:
        print(json.dumps({"bench": NAME, "skipped": "no Python with trl: run `make trl-venv` or pass --peer-python"}))
        return
    tritons = {"fastcrit": triton_version(sys.executable), "trl": triton_version(python)}
    if tritons["fastcrit"] != tritons["trl"]:
        print(
            f"bench_trl: WARNING triton {tritons['fastcrit']} here, {tritons['trl']} in {python}: the peaks "
            "differ by what importing it costs (make trl-venv installs the same one)",
            file=sys.stderr,
        )
    settings = ["small"] if args.quick else (list(SETTINGS) if args.setting == "both" else [args.setting])
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (5 if args.quick else 8)
    rows = []
    for name in settings:
        s = {
            **COMMON,
            "max_new_tokens": SETTINGS[name]["max_new_tokens"],
            "dtype": args.dtype,
            "fastcrit": SETTINGS[name]["fastcrit"],
        }
        model = model_dir(SETTINGS[name]["model"])
        # fastcrit_grpo_unshared: trainer.share_prompts=false (each sample runs its prompt again, as TRL does)
        sides = ("fastcrit_grpo", "fastcrit_grpo_unshared", "trl_grpo_trainer", "trl_grpo_trainer_no_gc")
        if args.compile:
            sides += ("fastcrit_grpo_unshared_compiled",)
        got, peaks, lens, compiles = ({k: [] for k in sides} for _ in range(4))
        with tempfile.TemporaryDirectory(prefix="fastcrit-bench-trl-") as d:
            for r in range(rounds):
                order = sides if r % 2 == 0 else sides[::-1]
                for side in order:
                    w = os.path.join(d, f"{name}-{side}-{r}")
                    out = (
                        run_fastcrit(
                            model, s, steps, args.threads, w, share=side == "fastcrit_grpo", compile="compiled" in side
                        )
                        if side.startswith("fastcrit")
                        else run_trl(python, model, s, steps, args.threads, w, gc=side == "trl_grpo_trainer")
                    )
                    got[side] += out["step_s"][args.warmup :]
                    peaks[side].append(out["peak_rss_mb"])
                    lens[side] += out["response_len"]
                    compiles[side].append(out.get("compile_s", 0.0))
                    print(
                        f"{name} round {r + 1}/{rounds} {side}: median step "
                        f"{1e3 * statistics.median(out['step_s'][args.warmup :]):.0f} ms",
                        file=sys.stderr,
                    )
        med = {k: quantiles(v)[0] for k, v in got.items()}
        per_update = s["prompts_per_step"] * s["n"] // s["updates_per_step"]
        base_micro = load_config(CONFIG).trainer.micro_batch_size
        for side in sides:
            m, lo, hi = quantiles([1e3 * x for x in got[side]])
            rows.append(
                {
                    "bench": NAME,
                    "variant": side,
                    "setting": name,
                    "model": SETTINGS[name]["model"] or "tiny",
                    "prompts": s["prompts_per_step"],
                    "n": s["n"],
                    "max_new_tokens": s["max_new_tokens"],
                    "threads": args.threads,
                    "dtype": args.dtype,
                    # rows per forward + backward: fastcrit's micro-batch, TRL's whole update batch
                    "micro_batch_size": min(int(s["fastcrit"].get("trainer.micro_batch_size", base_micro)), per_update)
                    if side.startswith("fastcrit")
                    else per_update,
                    "ms": m,
                    "ms_q20": lo,
                    "ms_q80": hi,
                    "peak_mb": max(peaks[side]),
                    "response_len": statistics.mean(lens[side]) if lens[side] else float("nan"),
                    # torch.compile's time per run (in its first steps, which the medians leave out)
                    "compile_s": statistics.mean(compiles[side]),
                    "speedup_vs_trl": med["trl_grpo_trainer"] / med[side],
                    "speedup_vs_trl_no_gc": med["trl_grpo_trainer_no_gc"] / med[side],
                    "rounds": rounds,
                    "steps": steps,
                    "triton": tritons["fastcrit" if side.startswith("fastcrit") else "trl"],
                }
            )
    out = write_rows(
        rows,
        NAME,
        settings=("setting", "model", "prompts", "n", "max_new_tokens", "threads", "dtype"),
        repeats=rounds * (steps - args.warmup),
    )
    for r in rows:
        print(
            f"{r['setting']:6s} {r['variant']:23s} {r['ms']:8.0f} ms/step  peak {r['peak_mb']:7.0f} MB  "
            f"len {r['response_len']:.1f}  x{r['speedup_vs_trl']:.2f} vs TRL, x{r['speedup_vs_trl_no_gc']:.2f} "
            "vs TRL without checkpointing",
            file=sys.stderr,
        )
    print(json.dumps({"bench": NAME, "csv": out, "rows": rows}))


if __name__ == "__main__":
    main()
