"""SFT: supervised fine-tuning on (prompt, answer) pairs, the warm start before RL.

Loss: token-mean negative log-likelihood of the answer tokens and EOS, through the same FSDP2
policy and fused log-prob kernel as RL. The result is a Hugging Face directory `<out>/final`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import torch

from fastcrit.config import Config
from fastcrit.data.datasets import load_dataset
from fastcrit.data.prompts import encode_answer, encode_prompts
from fastcrit.models.hf import load_tokenizer
from fastcrit.recipes.common import prepare_output_dir, resolve_model, step_indices
from fastcrit.rollout.batch import collate
from fastcrit.train.actor import build_actor, sft_step
from fastcrit.train.checkpoint import save_hf
from fastcrit.train.dist import DistContext, all_reduce_mean, barrier, stop_if_asked
from fastcrit.train.memory import return_memory
from fastcrit.train.metrics import RunLog
from fastcrit.train.trackers import TrackerSettings
from fastcrit.types import Rollout


def sft_output_dir(cfg: Config) -> str:
    return cfg.sft.output_dir or os.path.join(cfg.trainer.output_dir, "sft")


def finished(out_dir: str) -> str | None:
    final = os.path.join(out_dir, "final")
    return final if os.path.exists(os.path.join(final, "COMPLETE")) else None


def run_sft(ctx: DistContext, cfg: Config, model_path: str | None = None) -> str:
    """Train and save; returns the final model directory (reused when it already exists)."""
    out_dir = sft_output_dir(cfg)
    done = finished(out_dir)
    if done:
        if ctx.is_main:  # said, not silent: the settings given (data, steps) are not used
            print(
                f"sft: {done} is complete already: reused, nothing trained (delete it, or set sft.output_dir, "
                "to train again)",
                file=sys.stderr,
                flush=True,
            )
        return done
    if cfg.sft.steps <= 0:
        raise ValueError("sft.steps: must be > 0 to run SFT")
    if cfg.sft.batch_size % ctx.world_size:
        raise ValueError(
            f"sft.batch_size ({cfg.sft.batch_size}) must be a multiple of trainer.nproc ({ctx.world_size})"
        )
    torch.manual_seed(cfg.trainer.seed + ctx.rank)
    prepare_output_dir(cfg, ctx, out_dir)
    model_path = model_path or resolve_model(cfg, ctx)
    tok = load_tokenizer(model_path)
    data = load_dataset(cfg.sft.data, cfg.data.prompt_key, cfg.data.answer_key, strict=cfg.data.strict)
    prompts, too_long = encode_prompts(
        tok, data.examples, system=cfg.data.system_prompt, max_len=cfg.data.max_prompt_len
    )
    with RunLog(
        out_dir,
        enabled=ctx.is_main,
        total=cfg.sft.steps,
        start=0,
        progress=cfg.trainer.progress,
        desc="sft",
        show={"nll": "sft/nll", "tok/s": "throughput/tokens_per_s"},
        trackers=TrackerSettings.of(cfg, "sft"),
    ) as log:  # closed on every way out
        for msg in data.skipped + too_long:
            log.write(f"sft: skipped {msg}")
        optim = dataclasses.replace(
            cfg.optim, lr=cfg.sft.lr, warmup_steps=cfg.sft.warmup_steps, lr_schedule=cfg.sft.lr_schedule
        )
        actor = build_actor(
            model_path,
            dtype=cfg.model.dtype,
            device=ctx.device,
            world_size=ctx.world_size,
            optim=optim,
            total_updates=cfg.sft.steps,
            liger=cfg.model.liger,
            checkpointing=cfg.trainer.gradient_checkpointing,
            compile=cfg.trainer.compile,
            packed=cfg.trainer.pack_sequences,
        )
        answers = [encode_answer(tok, p.example.answer) for p in prompts]
        for step in range(1, cfg.sft.steps + 1):
            t0 = time.perf_counter()
            idx = step_indices(len(prompts), cfg.sft.batch_size, step, cfg.trainer.seed, ctx.rank, ctx.world_size)
            batch = collate(
                [Rollout(i, prompts[j].ids, answers[j], [0.0] * len(answers[j]), "stop") for i, j in enumerate(idx)],
                tok.pad_token_id,
            )
            stats = sft_step(
                actor,
                batch,
                micro_batch_size=cfg.trainer.micro_batch_size,
                grad_clip=cfg.optim.grad_clip,
                max_tokens=cfg.trainer.max_tokens_per_micro_batch,
                packed=cfg.trainer.pack_sequences,
            )
            stats = all_reduce_mean(stats)
            dt = time.perf_counter() - t0
            log.log(
                {
                    "step": step,
                    **stats,
                    "time/step_s": dt,
                    "throughput/tokens_per_s": batch.attention_mask.sum().item() * ctx.world_size / dt,
                }
            )
            if step < cfg.sft.steps:  # SIGTERM / SIGINT: stop here, unsaved (a rerun starts SFT over)
                stop_if_asked()
        final = os.path.join(out_dir, "final")
        save_hf(actor, tok, final, ctx, cfg.model.dtype)
        del actor  # the next stage loads its models afresh: this one's shards and optimizer state go
        return_memory(ctx.device)
        barrier()
        if ctx.is_main:
            open(os.path.join(final, "COMPLETE"), "w").close()
            log.write(f"sft: saved {final} (final nll {stats['sft/nll']:.4f})")
    barrier()
    return final
