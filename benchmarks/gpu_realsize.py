"""A real-size run on one GPU: GRPO on a model of Qwen2.5-1.5B's architecture (random weights, bf16),
FSDP2 with activation checkpointing, the native CUDA-graph engine; `fastcrit plan`'s prediction
beside each phase's measured peak; tokens/s/GPU; sync seconds per GiB; and whether a second
process can allocate what the trainer says it gave back.

    python benchmarks/gpu_realsize.py --out runs/gpu_check          # on a machine with one GPU
    python benchmarks/gpu_realsize.py --device cpu --small --out /tmp/rs   # a dry run of the script

No weights are downloaded: the model is built from the published config that fastcrit ships
(fastcrit/models/configs/), with the local tokenizer (its ids are a prefix of the model's
vocabulary). A random model never stops early, so every response is max_new_tokens long: the
heaviest case of each phase. Writes realsize.json (everything measured and predicted) and prints
a table; the last line is that JSON.

What the memory comparison covers: torch's allocator in the trainer process (the native engine
shares it), measured as the phase's `max_memory_allocated` (and `memory_reserved`) against the
plan's phase total less the CUDA contexts (which the allocator does not see). Saves and
evaluations are not timed phases of the run, so they are not compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

CONFIG_JSON = os.path.join(ROOT, "fastcrit", "models", "configs", "qwen2.5-1.5b-instruct.json")
SMALL = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=8192,
)
PHASES = ("rollout", "reward", "old_logprobs", "ref", "update", "sync")
GOAL = 0.15  # the plan's prediction within 15% of the measured peak


def run_sets(args, model_dir: str, out_dir: str) -> list[str]:
    """The run: configs/cpu/grpo.yaml's task and algorithm at a real model's size."""
    sets = [
        f"model.path={model_dir}",
        f"trainer.output_dir={out_dir}",
        "sft.steps=0",
        f"trainer.device={args.device}",
        f"trainer.total_steps={args.steps}",
        "trainer.eval_every=0",
        f"trainer.save_every={args.steps}",
        "trainer.progress=false",
        "data.val_size=8",
        f"data.prompts_per_step={args.prompts}",
        f"rollout.n={args.n}",
        "rollout.temperature=1.0",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"trainer.max_tokens_per_micro_batch={args.micro_tokens}",
        "trainer.micro_batch_size=64",
        "algorithm.mini_batches=2",
        f"model.liger={str(liger()).lower()}",
        f"trainer.gradient_checkpointing={str(not args.no_checkpointing).lower()}",
    ]
    if args.device == "cuda":
        sets += ["model.dtype=bfloat16", "rollout.engine_args.cuda_graph=true"]
    return sets


def liger() -> bool:
    """Liger's kernels where liger-kernel is installed (the gpu extra), else Hugging Face's modules:
    the plan counts what each keeps."""
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def build(args, model_dir: str) -> float:
    from fastcrit.models.tiny import build_from_config

    t0 = time.perf_counter()
    if not os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        build_from_config(
            model_dir, CONFIG_JSON, dtype="bfloat16", device=args.device, overrides=SMALL if args.small else None
        )
    return time.perf_counter() - t0


def plan(args, sets: list[str]) -> dict:
    from fastcrit.config import load_config
    from fastcrit.train.plan import device_capacity_gib, make_plan, render

    cfg = load_config(os.path.join(ROOT, "configs", "cpu", "grpo.yaml"), sets)
    p = make_plan(cfg, device_capacity_gib())
    print(render(p), flush=True)
    return p.to_dict()


def train(sets: list[str], log: str) -> tuple[int, float]:
    argv = [sys.executable, "-m", "fastcrit.cli", "train", os.path.join(ROOT, "configs", "cpu", "grpo.yaml")]
    for s in sets:
        argv += ["--set", s]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.call(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    return rc, time.perf_counter() - t0


def compare(planned: dict, rows: list[dict]) -> dict:
    """Per phase: the plan's allocator-visible total against the measured peak and reserved memory
    (medians over the steps after the first; MiB -> GiB)."""
    from fastcrit.train.plan import CONTEXTS

    out = {}
    later = rows[1:] or rows
    for name in PHASES:
        if name not in planned["phases"]:
            continue
        terms = planned["phases"][name]["terms_gib"]
        predicted = sum(v for k, v in terms.items() if k != CONTEXTS)
        peaks = sorted(r[f"memory/{name}_peak_mb"] / 1024 for r in later if f"memory/{name}_peak_mb" in r)
        reserved = sorted(r[f"memory/{name}_reserved_mb"] / 1024 for r in later if f"memory/{name}_reserved_mb" in r)
        if not peaks:
            continue
        peak = peaks[len(peaks) // 2]
        out[name] = {
            "predicted_gib": predicted,
            "peak_gib": peak,
            "reserved_gib": reserved[len(reserved) // 2] if reserved else None,
            "error": predicted / peak - 1.0,
        }
    return out


# A second process: how much device memory it can take, in 256 MiB blocks, until none is left.
PROBE = r"""
import torch
blocks, step = [], 256 << 20
while True:
    try:
        blocks.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
    except RuntimeError:
        break
print(len(blocks) * step)
"""


def _probe() -> int:
    return int(subprocess.check_output([sys.executable, "-c", PROBE], text=True).split()[-1])


def handover(model_dir: str, micro_tokens: int) -> dict:
    """The trainer builds the real-size policy (FSDP2, bf16 compute, checkpointing), takes one SFT
    step on random tokens (gradients and AdamW state exist), then frees its gradients and returns
    its cached memory (``free_gradients``, ``return_memory``: what the trainer does before an engine
    in another process wakes). A second process's capacity is probed before and after."""
    import torch

    from fastcrit.config import OptimConfig
    from fastcrit.rollout.batch import collate
    from fastcrit.train.actor import build_actor, free_gradients, sft_step
    from fastcrit.train.dist import init, shutdown
    from fastcrit.train.memory import return_memory
    from fastcrit.types import Rollout

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    ctx = init(0, 1, "cuda")
    try:
        actor = build_actor(
            model_dir, dtype="bfloat16", device=ctx.device, world_size=1, optim=OptimConfig(lr=1e-6), checkpointing=True
        )
        g = torch.Generator().manual_seed(0)
        rows, length = max(1, micro_tokens // 1024), 1024
        batch = collate(
            [
                Rollout(
                    i,
                    torch.randint(3, 400, (32,), generator=g).tolist(),
                    torch.randint(3, 400, (length - 32,), generator=g).tolist(),
                    [0.0] * (length - 32),
                    "length",
                )
                for i in range(rows)
            ],
            0,
        )
        sft_step(actor, batch, micro_batch_size=rows, grad_clip=1.0)
        torch.cuda.synchronize()
        before_probe = _probe()
        reserved_before = torch.cuda.memory_reserved()
        allocated_before = torch.cuda.memory_allocated()
        free_gradients(actor)
        return_memory(ctx.device)
        reserved_after = torch.cuda.memory_reserved()
        after_probe = _probe()
        released = reserved_before - reserved_after
        gained = after_probe - before_probe
        return {
            "reserved_before_gib": reserved_before / 2**30,
            "allocated_before_gib": allocated_before / 2**30,
            "reserved_after_gib": reserved_after / 2**30,
            "released_gib": released / 2**30,
            "second_process_before_gib": before_probe / 2**30,
            "second_process_after_gib": after_probe / 2**30,
            "second_process_gained_gib": gained / 2**30,
            "ok": gained >= 0.9 * released - (256 << 20),
        }  # the probe counts whole 256 MiB blocks
    finally:
        shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/gpu_check"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="a small model of the same family (a dry run)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--micro-tokens", type=int, default=16384)
    ap.add_argument("--work", default="/tmp/fastcrit_realsize")
    ap.add_argument("--skip-handover", action="store_true")
    ap.add_argument("--no-checkpointing", action="store_true", help="the update without activation checkpointing")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model_dir, run_dir = os.path.join(args.work, "model"), os.path.join(args.work, "run")
    subprocess.call(["rm", "-rf", run_dir])
    result: dict = {
        "config_json": CONFIG_JSON,
        "small": args.small,
        "device": args.device,
        "liger": liger(),
        "checkpointing": not args.no_checkpointing,
        "build_s": build(args, model_dir),
    }
    sets = run_sets(args, model_dir, run_dir)
    result["sets"] = sets
    result["plan"] = plan(args, sets)
    rc, wall = train(sets, os.path.join(args.out, "realsize_train.log"))
    result.update(train_rc=rc, train_s=wall)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    rows = [json.loads(x) for x in open(metrics)] if os.path.exists(metrics) else []
    if rows:
        subprocess.call(["cp", metrics, os.path.join(args.out, "realsize_metrics.jsonl")])
    if rows:
        later = rows[1:] or rows

        def med(key):
            vals = sorted(r[key] for r in later if key in r)
            return vals[len(vals) // 2] if vals else None

        result["tokens_per_s_per_gpu"] = med("throughput/tokens_per_s")
        result["step_s"] = med("time/step_s")
        result["phase_s"] = {k[5:-2]: med(k) for k in sorted(later[-1]) if k.startswith("time/")}
        sync_s, gib = med("time/sync_s"), med("sync/gib")
        result["sync_gib"], result["sync_s_per_gib"] = gib, (sync_s / gib if sync_s and gib else None)
        result["memory"] = compare(result["plan"], rows) if args.device == "cuda" else {}
    if args.device == "cuda" and not args.skip_handover:
        result["handover"] = handover(model_dir, args.micro_tokens)
    print(
        f"\nrun rc={rc} in {wall:.0f} s; {len(rows)} steps; tokens/s/GPU {result.get('tokens_per_s_per_gpu')}; "
        f"step {result.get('step_s')} s; sync {result.get('sync_gib')} GiB at {result.get('sync_s_per_gib')} s/GiB"
    )
    for name, m in result.get("memory", {}).items():
        flag = "ok" if abs(m["error"]) <= GOAL else "OFF"
        print(
            f"  {name:<13} plan {m['predicted_gib']:7.2f} GiB  measured peak {m['peak_gib']:7.2f}  "
            f"reserved {m['reserved_gib'] or 0:7.2f}  plan/peak - 1 = {m['error']:+.1%} {flag}"
        )
    if "handover" in result:
        h = result["handover"]
        print(
            f"  handover: released {h['released_gib']:.2f} GiB; a second process gained "
            f"{h['second_process_gained_gib']:.2f} GiB ({'ok' if h['ok'] else 'SHORT'})"
        )
    with open(os.path.join(args.out, "realsize.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("plan", "sets")}))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
