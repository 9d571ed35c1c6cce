"""Generation throughput: NativeEngine vs Hugging Face ``model.generate`` on the tiny Qwen2 model.

Run alone: ``python benchmarks/bench_generate.py [--quick] [--threads N] [--model tiny]``. Appends
rows to benchmarks/results/bench_generate.csv and prints one JSON object as the last line.

Both sides get the same chat-formatted prompts, ``n`` samples each, temperature 1, the same
``max_new_tokens``, and stop at EOS. The baseline is ``model.generate(do_sample=True,
num_return_sequences=n)`` on the left-padded batch, *without* log-probs (HF would need
``output_scores`` for them, which only costs more), so it is the strongest plain-HF peer; it prefills
each prompt n times where the engine prefills it once. Throughput is generated tokens (up to and
including EOS) per second of wall time; the tokens differ between the two because the random
streams differ, so the token counts are reported too.

On CUDA a third side takes the same turns: the native engine with the decode step captured as a
CUDA graph (``cuda_graph=True``, its own copy of the weights); peaks there are torch's allocation.

Times come from this process with glibc's allocator as a training run has it, the two sides taking
turns (HF, engine, HF, ...: a change in the machine's load reaches both alike). Peak memory (growth
of the resident set on CPU: the kernel's high-water mark, or where that cannot be reset a sample
every 0.2 ms; see ``_common._timed``) comes from a child process run with a fixed 64 KiB mmap
threshold, so that freed blocks leave the resident set at once: that setting makes every mid-sized
allocation a fresh mmap and makes the engine's decode several times slower, so it must not be on
while timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import fixed_mmap_threshold, machine, measure_interleaved, write_rows

from fastcrit.models.hf import load_tokenizer, resolve_model_path
from fastcrit.rollout.decode import c_attention
from fastcrit.rollout.native import NativeEngine
from fastcrit.types import SamplingParams

NAME = "generate"
WORDS = [
    "apple",
    "banana",
    "kiwi",
    "orange",
    "plum",
    "grape",
    "melon",
    "cherry",
    "lemon",
    "mango",
    "peach",
    "pear",
    "fig",
    "date",
    "lime",
    "berry",
]


def make_prompts(tok, count: int) -> list[list[int]]:
    out = []
    for i in range(count):
        w = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + i % 4))
        msgs = [{"role": "user", "content": f"Reverse the letters of: {w}"}]
        out.append(tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False))
    return out


def hf_generate(model, tok, prompts, n: int, max_new: int, seed: int) -> int:
    enc = tok.pad([{"input_ids": p} for p in prompts], return_tensors="pt").to(model.device)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=n,
            max_new_tokens=max_new,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    gen = out[:, enc["input_ids"].shape[1] :]
    # Tokens up to and including the first EOS (HF pads the rest with pad_token_id).
    is_eos = (gen == tok.eos_token_id).int()
    after = (is_eos.cumsum(1) - is_eos) > 0
    return int((~after).sum())


def memory_probe(engine, model, tok, settings, device) -> dict:
    """Peak memory (MB) of each side for each setting, one warm-up and one sampled run each."""
    from _common import _timed

    peaks = {}
    for num_prompts, n, max_new in settings:
        prompts = make_prompts(tok, num_prompts)
        params = SamplingParams(n=n, max_new_tokens=max_new, temperature=1.0, seed=0)
        fns = {
            "hf_generate": lambda: hf_generate(model, tok, prompts, n, max_new, seed=0),
            "native_engine": lambda: engine.generate(prompts, params),
        }
        for k, fn in fns.items():
            fn()
            peaks[f"{k}/{num_prompts}/{n}/{max_new}"] = _timed(fn, device)[1] / 2**20
    return peaks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one small setting, few repeats")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--model", default="tiny", help="model spec or directory (default: the tiny model)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)  # the child for peaks
    args = ap.parse_args()
    if args.memory_probe:
        fixed_mmap_threshold()  # re-executes this command with the threshold set
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = resolve_model_path(args.model)
    tok = load_tokenizer(path)
    engine = NativeEngine(path, tok, dtype=args.dtype, device=device)
    model = engine.model  # the same weights for both sides
    # On CUDA a third side: the decode step captured as a CUDA graph (NativeEngine(cuda_graph=True)),
    # its own copy of the same weights.
    graphed = (
        NativeEngine(path, tok, dtype=args.dtype, device=device, cuda_graph=True) if device.type == "cuda" else None
    )
    settings = [(4, 4, 16)] if args.quick else [(8, 8, 32), (16, 8, 64), (32, 8, 128)]
    repeats = 3 if args.quick else 7
    if args.memory_probe:
        print(json.dumps(memory_probe(engine, model, tok, settings, device)))
        return
    peaks = None
    if device.type == "cpu":
        probe = subprocess.run([sys.executable, *sys.argv, "--memory-probe"], capture_output=True, text=True)
        if probe.returncode != 0:
            raise SystemExit(f"bench_generate: the memory probe failed:\n{probe.stderr[-3000:]}")
        peaks = json.loads(probe.stdout.strip().splitlines()[-1])
    # which decode attention the engine runs (the C one, or torch ops where it is off, not built, or
    # refused), so that a row says what it measured
    attn = "c" if c_attention(model) else "torch ops"
    info = {
        **machine(),
        "threads": torch.get_num_threads(),
        "model": args.model,
        "dtype": args.dtype,
        "decode_attn": attn,
    }
    rows = []
    for num_prompts, n, max_new in settings:
        prompts = make_prompts(tok, num_prompts)
        params = SamplingParams(n=n, max_new_tokens=max_new, temperature=1.0, seed=0)
        counts = {}

        def run_native():
            counts["native_engine"] = sum(len(r.output_ids) for r in engine.generate(prompts, params))

        def run_hf():
            counts["hf_generate"] = hf_generate(model, tok, prompts, n, max_new, seed=0)

        def run_graphed():
            counts["native_cuda_graph"] = sum(len(r.output_ids) for r in graphed.generate(prompts, params))

        sides = {"hf_generate": run_hf, "native_engine": run_native}
        if graphed is not None:
            sides["native_cuda_graph"] = run_graphed
        # the sides take turns (hf, native, hf, ...), so a change in the machine's load reaches each alike
        res = measure_interleaved(sides, device, repeats, warmup=2, memory=False)
        if peaks is not None:
            for k in res:
                res[k]["peak_mb"] = peaks[f"{k}/{num_prompts}/{n}/{max_new}"]
        for k, r in res.items():
            tps = counts[k] / (r["ms"] / 1e3)
            rows.append(
                {
                    "bench": NAME,
                    "variant": k,
                    "prompts": num_prompts,
                    "n": n,
                    "max_new_tokens": max_new,
                    "tokens": counts[k],
                    "tokens_per_s": tps,
                    **r,
                    "tps_ratio_vs_hf": tps / (counts["hf_generate"] / (res["hf_generate"]["ms"] / 1e3)),
                    "mem_ratio_vs_hf": r["peak_mb"] / max(res["hf_generate"]["peak_mb"], 1e-9),
                    **info,
                }
            )
    out = write_rows(rows, NAME, settings=("prompts", "n", "max_new_tokens", "model", "dtype"), repeats=repeats)
    for r in rows:
        print(
            f"{r['variant']:14s} prompts={r['prompts']:3d} n={r['n']} new={r['max_new_tokens']:4d}  "
            f"{r['ms']:9.1f} ms  {r['tokens_per_s']:9.1f} tok/s  peak {r['peak_mb']:8.1f} MB  "
            f"x{r['tps_ratio_vs_hf']:.2f} tok/s vs HF  (decode attention: {r['decode_attn']})",
            file=sys.stderr,
        )
    print(json.dumps({"bench": NAME, "csv": out, "rows": rows}))


if __name__ == "__main__":
    main()
