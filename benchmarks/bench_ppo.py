"""ppo_policy_loss (dual clip, token-mean) and value_loss forward + backward vs eager torch autograd
(verl's formulas); then the whole GRPO actor loss from hidden states (``--lm``, the fused linear
section), side by side in one process, taking turns:

  gemm3            three plain GEMMs of the loss's shapes: h @ W^T, dlogits @ W, dlogits^T @ h
  naive            full logits -> log_softmax -> gather -> PPO clip + k3 KL, fwd+bwd by autograd
  fused_recompute  fused_linear_ppo_loss(grad_in_forward=False): fused_logprobs, logits recomputed
                   in its backward (four GEMMs)
  fused_gif        fused_linear_ppo_loss (gradients computed in the forward: three GEMMs)
  fused_gif_entropy  the same, also computing the entropy for its stats (``entropy=True``, the default)
  liger_grpo       on a GPU where liger-kernel is installed: its LigerFusedLinearGRPOLoss on the same
                   inputs (token-mean "bnpo", the same clip range and k3 KL; no dual clip), eager
  fused_gif_logits16  on a GPU in bf16 / fp16: fused_gif with ``logits_dtype`` the operands' dtype
                   (each chunk's logits as the 16-bit GEMM writes them, not fp32)

at N tokens, H, V (default the issue's N=2048, H=896, V=151936, fp32: each GEMM ~0.56 TFLOP, a few
seconds on 2 CPU cores; ``--quick``: N=256, H=256, V=16384). The loss: token-mean, clip 0.2/0.28,
dual clip 3, k3 KL 0.04; entropy coefficient 0, so naive and every fused row but fused_gif_entropy
compute no entropy (``entropy=False``, as verl's update does with a zero coefficient).
Peak memory includes the gradients (d_W is V x H x 4 B for every case). Times are medians over
``--lm-repeats`` turns after one warm-up turn; the machine's load average at the start and the end
is in every row (on a shared machine, read the times with it). The warm-up turn also checks each
case's loss and gradients against naive's (``rel_err_vs_naive`` in the rows; a fused case further
off than ``AGREE_TOL`` makes the run exit 1 after its rows are written: a fast wrong kernel is not
a result).

Run alone: ``python benchmarks/bench_ppo.py [--quick] [--threads 2] [--lm-only] [--lm-shape N,H,V]``.
Appends rows to benchmarks/results/bench_ppo.csv and prints one JSON object as the last line.
Measurement as in bench_kl.py (CPU: ``backend="torch"``, RSS growth; GPU: ``triton`` too, torch
peak allocation).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch
from _common import machine, measure, measure_interleaved, start, write_rows

from fastcrit_kernels import fused_linear_ppo_loss, ppo_policy_loss, value_loss
from fastcrit_kernels.logprobs import logprobs_reference

NAME = "ppo"


def eager_policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=3.0):
    """verl compute_policy_loss_vanilla, token-mean, in eager torch."""
    neg_kl = torch.clamp(lp - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    lc = torch.maximum(l1, l2)
    l3 = -adv * clip_c
    loss_mat = torch.where(adv < 0, torch.min(l3, lc), lc)
    with torch.no_grad():  # the stats, as verl logs them
        _ = ((l2 > l1).float() * mask).sum() / mask.sum(), (-neg_kl * mask).sum() / mask.sum()
    return (loss_mat * mask).sum() / mask.sum()


def eager_value_loss(v, vo, R, mask, clip=0.5):
    vc = torch.clamp(v, vo - clip, vo + clip)
    return 0.5 * (torch.max((v - R) ** 2, (vc - R) ** 2) * mask).sum() / mask.sum()


def eager_k3(lp, ref, mask):
    """verl's low_var_kl, token-mean, in eager torch."""
    d = torch.clamp(ref - lp, min=-20.0, max=20.0)
    kl = torch.clamp(torch.exp(d) - d - 1, min=-10.0, max=10.0)
    return (kl * mask).sum() / mask.sum()


def lm_cases(N: int, H: int, V: int, device, backend: str, chunks_mib=(), dtype=torch.float32) -> dict:
    """The four fused-linear cases (see the module docstring) on one set of inputs. With a 16-bit
    ``dtype`` hidden states and lm_head are in it; naive then computes the logits in it and the
    log-softmax in fp32 (verl's order), and gemm3's GEMMs run in it."""
    g = torch.Generator().manual_seed(0)
    B, T = max(1, N // 1024), min(N, 1024)
    hidden = torch.randn(B, T, H, generator=g).to(device, dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.02).to(device, dtype).requires_grad_()
    labels = torch.randint(0, V, (B, T), generator=g).to(device)
    mask = torch.ones(B, T, device=device)
    adv = torch.randn(B, generator=g).to(device)
    base = (torch.randn(B, T, generator=g) * 0.1 - 12.0).to(device)  # plausible log-prob scale
    old, ref = base + 0.05, base - 0.05
    kw = dict(
        ref_logp=ref, kl_coef=0.04, kl_kind="low_var_kl", clip_low=0.2, clip_high=0.28, clip_c=3.0, backend=backend
    )

    def zero(loss, keep):
        """Drop the gradients (the next case's peak counts its own), or with ``keep`` hand them
        back with the loss for the agreement check."""
        out = (loss.detach().float(), hidden.grad, weight.grad) if keep else None
        hidden.grad = None
        weight.grad = None
        return out

    def gemm3(keep=False):
        h, w = hidden.detach().view(-1, H), weight.detach()
        z = torch.mm(h, w.t())
        d_h = torch.mm(z, w)
        d_w = torch.mm(z.t(), h)
        del z, d_h, d_w

    # each case drops its gradients when done, so that the next one's peak memory counts its own
    def naive(keep=False):
        if dtype == torch.float32:
            lp = logprobs_reference(hidden, weight, labels, dtype=torch.float32)
        else:
            logits = (hidden @ weight.t()).float()
            lp = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        a = adv[:, None].expand(B, T)
        loss = eager_policy_loss(lp, old, a, mask) + 0.04 * eager_k3(lp, ref, mask)
        loss.backward()
        return zero(loss, keep)

    def fused(gif, chunk_bytes=None, entropy=False, logits_dtype=None):
        def run(keep=False):
            loss, _ = fused_linear_ppo_loss(
                hidden,
                weight,
                labels,
                old,
                adv,
                mask,
                grad_in_forward=gif,
                chunk_bytes=chunk_bytes,
                entropy=entropy,
                logits_dtype=logits_dtype,
                **kw,
            )
            loss.backward()
            return zero(loss, keep)

        return run

    def liger_grpo():
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        peer = LigerFusedLinearGRPOLoss(
            beta=0.04, compiled=False, use_ref_model=True, epsilon_low=0.2, epsilon_high=0.28, loss_type="bnpo"
        )

        def run(keep=False):
            loss, _ = peer(hidden, weight, labels, mask.long(), adv, ref_per_token_logps=ref, old_per_token_logps=old)
            loss.backward()
            return zero(loss, keep)

        return run

    cases = {
        "gemm3": gemm3,
        "naive": naive,
        "fused_recompute": fused(False),
        "fused_gif": fused(True),
        "fused_gif_entropy": fused(True, entropy=True),
    }
    for mib in chunks_mib:  # the grad-in-forward path at other chunk sizes than its default
        cases[f"fused_gif_{mib}MiB"] = fused(True, mib << 20)
    if device.type == "cuda" and importlib.util.find_spec("liger_kernel") is not None:
        cases["liger_grpo"] = liger_grpo()
    if backend == "triton" and dtype != torch.float32:  # the chunks' logits as the 16-bit GEMM writes them
        cases["fused_gif_logits16"] = fused(True, logits_dtype=dtype)
        for mib in chunks_mib:
            cases[f"fused_gif_logits16_{mib}MiB"] = fused(True, mib << 20, logits_dtype=dtype)
    return cases


# How far a case's loss and gradients may be from naive's, relative (see ``agreement``). 16-bit:
# naive rounds its logits to the operands' dtype and every case returns 16-bit gradients.
AGREE_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-2}


def agreement(cases: dict, dtype) -> dict:
    """Runs every case once, keeping its loss and gradients, against naive's: {case: the largest
    relative error of loss, d_hidden and d_weight (norm of the difference over naive's norm; the
    loss over max(|loss|, 0.01))}. A fast row is only worth reporting if it computes the same
    thing. This round is also the cases' warm-up."""
    ref = cases["naive"](keep=True)
    errs = {"naive": 0.0}
    for k, fn in cases.items():
        out = None if k == "naive" else fn(keep=True)
        if out is None:  # naive itself; gemm3 computes no loss
            continue
        loss, d_h, d_w = out
        e = float((loss - ref[0]).abs() / ref[0].abs().clamp(min=0.01))
        for got, want in ((d_h, ref[1]), (d_w, ref[2])):
            want = want.float()
            e = max(e, float((got.float() - want).norm() / want.norm().clamp(min=1e-30)))
        errs[k] = e
        del out, loss, d_h, d_w
    return errs


def lm_rows(args, device, info) -> list[dict]:
    N, H, V = (256, 256, 16384) if args.quick else (2048, 896, 151936)
    dtype = getattr(torch, args.lm_dtype)
    if args.lm_shape:
        N, H, V = (int(x) for x in args.lm_shape.split(","))
    repeats = args.lm_repeats or (2 if args.quick else 3)
    backend = "triton" if device.type == "cuda" else "torch"
    load0 = os.getloadavg()[0]
    print(
        f"fused linear loss N={N} H={H} V={V} {args.lm_dtype}, {repeats} turns + 1 warm-up, load {load0:.2f}, "
        f"{torch.get_num_threads()} threads",
        file=sys.stderr,
        flush=True,
    )
    chunks = [int(x) for x in args.lm_chunks.split(",")] if args.lm_chunks else []
    cases = lm_cases(N, H, V, device, backend, chunks, dtype)
    errs = agreement(cases, dtype)
    tol = AGREE_TOL[dtype]
    for k, e in errs.items():
        print(f"  {k:16s} relative error vs naive {e:.1e}{'  DISAGREES' if e > tol else ''}", file=sys.stderr)
    res = measure_interleaved(
        cases,
        device,
        repeats,
        warmup=0,  # agreement() ran every case once
        log=lambda k, r, t, c: print(
            f"  {k:16s} turn {r:>2} {t:8.2f} s  cpu {c:8.2f} s  load {os.getloadavg()[0]:.2f}",
            file=sys.stderr,
            flush=True,
        ),
    )
    load1 = os.getloadavg()[0]
    rows = []
    for k, r in res.items():
        rows.append(
            {
                "bench": f"{NAME}_fused_linear",
                "variant": k,
                "N": N,
                "H": H,
                "V": V,
                "dtype": args.lm_dtype,
                **r,
                "time_ratio_vs_gemm3": r["ms"] / res["gemm3"]["ms"],
                "cpu_ratio_vs_gemm3": r["cpu_ms"] / res["gemm3"]["cpu_ms"],
                "cpu_ratio_vs_naive": r["cpu_ms"] / res["naive"]["cpu_ms"],
                "time_ratio_vs_naive": r["ms"] / res["naive"]["ms"],
                "mem_ratio_vs_naive": r["peak_mb"] / max(res["naive"]["peak_mb"], 1e-9),
                "mem_ratio_vs_recompute": r["peak_mb"] / max(res["fused_recompute"]["peak_mb"], 1e-9),
                "rel_err_vs_naive": errs.get(k, ""),
                **info,
                "loadavg_1m": round(load0, 2),
                "loadavg_1m_end": round(load1, 2),
                "repeats": repeats,
            }
        )
    return rows


def main() -> None:
    args, device = start(__doc__, extra=_extra_args)
    info = machine()
    rows = [] if args.lm_only else policy_rows(args, device, info)
    if args.lm or args.lm_only:
        rows += lm_rows(args, device, info)
    path = write_rows(rows, NAME, settings=("B", "T", "N", "H", "V", "dtype"), repeats=3 if args.quick else 11)
    for r in rows:
        shape = f"N={r['N']} H={r['H']} V={r['V']}" if "N" in r else f"B={r['B']:4d} T={r['T']:5d}"
        ratio = (
            f"x{r['time_ratio_vs_gemm3']:.2f} vs gemm3  x{r['time_ratio_vs_naive']:.2f} vs naive time  "
            f"(cpu time x{r['cpu_ratio_vs_gemm3']:.2f}, x{r['cpu_ratio_vs_naive']:.2f})  "
            f"x{r['mem_ratio_vs_naive']:.2f} vs naive mem"
            if "N" in r
            else f"x{r['time_ratio_vs_eager']:.2f} time  x{r['mem_ratio_vs_eager']:.2f} mem"
        )
        print(
            f"{r['bench']:20s} {r['variant']:16s} {shape}  {r['ms']:10.1f} ms [{r['ms_q20']:.0f}, {r['ms_q80']:.0f}]  "
            f"peak {r['peak_mb']:8.1f} MB  {ratio}",
            file=sys.stderr,
        )
    print(json.dumps({"bench": NAME, "csv": path, "rows": rows}))
    wrong = [
        r["variant"]
        for r in rows
        if r["variant"].startswith("fused") and r.get("rel_err_vs_naive", "") != ""
        if r["rel_err_vs_naive"] > AGREE_TOL[getattr(torch, r["dtype"])]
    ]
    if wrong:
        sys.exit(f"bench_ppo: {', '.join(wrong)} disagree with naive beyond {AGREE_TOL}: see rel_err_vs_naive")


def _extra_args(ap) -> None:
    ap.add_argument(
        "--lm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the fused linear loss section (default on; --no-lm skips it)",
    )
    ap.add_argument("--lm-only", action="store_true", help="only the fused linear loss section")
    ap.add_argument("--lm-shape", default=None, help="N,H,V for the fused linear section")
    ap.add_argument("--lm-repeats", type=int, default=None, help="timed turns per case (default 3, quick 2)")
    ap.add_argument(
        "--lm-dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="hidden states and lm_head dtype of the fused linear section (default float32)",
    )
    ap.add_argument(
        "--lm-chunks", default=None, help="comma list of MiB: also the grad-in-forward path with these chunk_bytes"
    )


def policy_rows(args, device, info) -> list[dict]:
    shapes = [(8, 512)] if args.quick else [(16, 512), (64, 2048), (256, 4096)]
    repeats = 3 if args.quick else 11
    backends = ["torch", "triton"] if device.type == "cuda" else ["torch"]
    rows = []
    for B, T in shapes:
        g = torch.Generator().manual_seed(0)
        old = (-torch.rand(B, T, generator=g) * 3).to(device)
        lp0 = old + (torch.randn(B, T, generator=g) * 0.3).to(device)
        adv = torch.randn(B, T, generator=g).to(device)
        mask = (torch.rand(B, T, generator=g) > 0.2).to(device)
        maskf = mask.float()
        vo = torch.randn(B, T, generator=g).to(device)
        v0 = vo + (torch.randn(B, T, generator=g) * 0.5).to(device)
        R = torch.randn(B, T, generator=g).to(device)

        def step_policy(f):
            lp = lp0.clone().requires_grad_(True)
            (f(lp) * 1.3).backward()

        def step_value(f):
            v = v0.clone().requires_grad_(True)
            (f(v) * 1.3).backward()

        cases = {
            ("policy", "eager_torch"): lambda: step_policy(lambda lp: eager_policy_loss(lp, old, adv, maskf)),
            ("value", "eager_torch"): lambda: step_value(lambda v: eager_value_loss(v, vo, R, maskf)),
        }
        for be in backends:
            cases[("policy", f"fastcrit_{be}")] = lambda be=be: step_policy(
                lambda lp: ppo_policy_loss(lp, old, adv, mask, clip_high=0.28, clip_c=3.0, backend=be)[0]
            )
            cases[("value", f"fastcrit_{be}")] = lambda be=be: step_value(
                lambda v: value_loss(v, vo, R, mask, clip=0.5, backend=be)[0]
            )
        res = {k: measure(f, device, repeats) for k, f in cases.items()}
        for (what, variant), r in res.items():
            base = res[(what, "eager_torch")]
            rows.append(
                {
                    "bench": f"{NAME}_{what}",
                    "variant": variant,
                    "B": B,
                    "T": T,
                    "dtype": "float32",
                    **r,
                    "time_ratio_vs_eager": r["ms"] / base["ms"],
                    "mem_ratio_vs_eager": r["peak_mb"] / max(base["peak_mb"], 1e-9),
                    **info,
                }
            )
    return rows


if __name__ == "__main__":
    main()
