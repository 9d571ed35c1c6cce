"""GRPO and RLOO with a verifiable reward: rollout -> reward -> advantages -> update -> weight sync.

Departures from verl worth knowing: the behaviour log-probs are the rollout engine's (no extra
trainer forward to recompute them; on the native engine they are the same fp32 numbers up to
kernel rounding), and the KL to the frozen reference is a loss term (verl's `use_kl_loss`), never
folded into the reward.
"""
from __future__ import annotations

import json
import os
import time

import torch

from fastcrit.algos.advantages import outcome_advantages
from fastcrit.config import Config
from fastcrit.data.datasets import load_dataset
from fastcrit.data.prompts import encode_prompts
from fastcrit.models.hf import load_tokenizer
from fastcrit.recipes.common import prepare_output_dir, resolve_model, step_indices
from fastcrit.recipes.sft import run_sft
from fastcrit.reward import RewardItem, get_reward_manager
from fastcrit.rollout import make_engine
from fastcrit.rollout.batch import collate
from fastcrit.train.actor import build_actor, compute_logprobs, update_policy
from fastcrit.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from fastcrit.train.colocate import sync_weights
from fastcrit.train.dist import DistContext, all_reduce_mean
from fastcrit.train.metrics import RunLog
from fastcrit.types import SamplingParams


def score(reward, tok, rollouts, prompts) -> tuple[torch.Tensor, float]:
    texts = [tok.decode(r.output_ids, skip_special_tokens=True) for r in rollouts]
    items = [RewardItem(prompts[r.prompt_index].example.prompt, t, prompts[r.prompt_index].example.answer,
                        prompts[r.prompt_index].example.meta) for r, t in zip(rollouts, texts)]
    results = reward(items)
    exact = sum(bool(r.info.get("exact", False)) for r in results) / len(results)
    return torch.tensor([r.score for r in results], dtype=torch.float32), exact


def evaluate(engine, tok, reward, prompts, cfg: Config, ctx: DistContext) -> dict[str, float]:
    """Greedy decoding on this rank's share of the validation prompts; mean over all ranks."""
    share = prompts[ctx.rank::ctx.world_size]
    params = SamplingParams(n=1, max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0)
    scores, exact = score(reward, tok, engine.generate([p.ids for p in share], params), share)
    return all_reduce_mean({"val/reward": scores.mean().item(), "val/exact": exact})


def run_grpo(ctx: DistContext, cfg: Config) -> dict:
    torch.manual_seed(cfg.trainer.seed + ctx.rank)
    out = cfg.trainer.output_dir
    prepare_output_dir(cfg, ctx, out)
    model_path = resolve_model(cfg, ctx)
    if cfg.sft.steps > 0:  # warm start: teach the answer format first (reused once done)
        model_path = run_sft(ctx, cfg, model_path)
    tok = load_tokenizer(model_path)
    data = load_dataset(cfg.data.train, cfg.data.prompt_key, cfg.data.answer_key)
    prompts, too_long = encode_prompts(tok, data.examples, system=cfg.data.system_prompt,
                                       max_len=cfg.data.max_prompt_len)
    val = []
    if cfg.data.val:
        vdata = load_dataset(cfg.data.val, cfg.data.prompt_key, cfg.data.answer_key, "test")
        val, _ = encode_prompts(tok, vdata.examples[:cfg.data.val_size],
                                system=cfg.data.system_prompt, max_len=cfg.data.max_prompt_len)
    reward = get_reward_manager(cfg.reward.name)
    o = cfg.optim
    actor = build_actor(model_path, dtype=cfg.model.dtype, device=ctx.device,
                        world_size=ctx.world_size, lr=o.lr, weight_decay=o.weight_decay,
                        betas=(o.beta1, o.beta2), eps=o.eps, warmup_steps=o.warmup_steps)
    ref = None
    if cfg.algorithm.kl_coef != 0.0:
        ref = build_actor(model_path, dtype=cfg.model.dtype, device=ctx.device,
                          world_size=ctx.world_size, trainable=False)
    engine = make_engine(cfg.rollout, model_path, dtype=cfg.model.dtype, device=ctx.device,
                         seed=cfg.trainer.seed + ctx.rank)

    start = 0
    ckpt = latest_checkpoint(out) if cfg.trainer.resume else None
    if ckpt:
        start = load_checkpoint(actor, ctx, ckpt)["step"]
    log = RunLog(out, enabled=ctx.is_main, total=cfg.trainer.total_steps, start=start,
                 progress=cfg.trainer.progress)
    for msg in data.skipped + too_long:
        log.write(f"data: skipped {msg}")
    if ckpt:
        log.write(f"resumed from {ckpt} at step {start}")
    sync_weights(actor, engine, cfg.rollout.weight_bucket_mb)  # the engine starts from the policy
    first_val = evaluate(engine, tok, reward, val, cfg, ctx) if val else {}
    if first_val:
        log.write(f"step {start}: validation reward {first_val['val/reward']:.3f} "
                  f"(exact {first_val['val/exact']:.3f})")

    temp = cfg.rollout.temperature or 1.0  # greedy rollouts are scored at temperature 1
    a = cfg.algorithm
    per_rank = cfg.data.prompts_per_step // ctx.world_size
    history: list[float] = []
    for step in range(start + 1, cfg.trainer.total_steps + 1):
        t0 = time.perf_counter()
        idx = step_indices(len(prompts), cfg.data.prompts_per_step, step, cfg.trainer.seed,
                           ctx.rank, ctx.world_size)
        batch_prompts = [prompts[i] for i in idx]
        params = SamplingParams(n=cfg.rollout.n, max_new_tokens=cfg.rollout.max_new_tokens,
                                temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                top_k=cfg.rollout.top_k,
                                seed=cfg.trainer.seed * 1_000_003 + step * 1009 + ctx.rank)
        rollouts = engine.generate([p.ids for p in batch_prompts], params)
        t1 = time.perf_counter()

        scores, exact = score(reward, tok, rollouts, batch_prompts)
        t2 = time.perf_counter()

        engine.sleep()
        batch = collate(rollouts, tok.pad_token_id, group_offset=ctx.rank * per_rank)
        batch.scores = scores
        if ref is not None:
            batch.ref_logprobs = compute_logprobs(ref, batch, temp, cfg.trainer.micro_batch_size)
        batch.advantages = outcome_advantages(a.name, scores, batch.group_ids, batch.response_mask,
                                              norm_by_std=a.norm_adv_by_std)
        stats = update_policy(actor, batch, temperature=temp,
                              micro_batch_size=cfg.trainer.micro_batch_size,
                              grad_clip=cfg.optim.grad_clip, clip_low=a.clip_low,
                              clip_high=a.clip_high, clip_c=a.clip_c, agg=a.loss_agg,
                              kl_coef=a.kl_coef, kl_kind=a.kl_kind, entropy_coef=a.entropy_coef,
                              ppo_epochs=a.ppo_epochs, mini_batches=a.mini_batches)
        t3 = time.perf_counter()
        engine.wake()
        sync_s = sync_weights(actor, engine, cfg.rollout.weight_bucket_mb)
        t4 = time.perf_counter()

        tokens = batch.attention_mask.sum().item()
        row = all_reduce_mean({
            "reward/mean": scores.mean().item(), "reward/exact": exact,
            "reward/std": scores.std().item() if len(scores) > 1 else 0.0,
            "response_len/mean": batch.response_mask.sum(-1).mean().item(),
            "time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/train_s": t3 - t2,
            "time/sync_s": sync_s, "time/step_s": t4 - t0,
            "throughput/tokens_per_s": tokens / (t4 - t0), **stats})
        row["throughput/tokens_per_s"] *= ctx.world_size  # all processes together
        if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0 and val:
            row.update(evaluate(engine, tok, reward, val, cfg, ctx))
        log.log({"step": step, **row})
        history.append(row["reward/mean"])
        last = step == cfg.trainer.total_steps
        if last or (cfg.trainer.save_every and step % cfg.trainer.save_every == 0):
            save_checkpoint(actor, tok, ctx, out, step, {"model_path": model_path})

    last_val = evaluate(engine, tok, reward, val, cfg, ctx) if val else {}
    engine.close()
    log.close()
    k = max(1, min(10, len(history) // 4)) if history else 0
    summary = {
        "steps": cfg.trainer.total_steps, "resumed_from": start,
        "train_reward_first": sum(history[:k]) / k if k else None,
        "train_reward_last": sum(history[-k:]) / k if k else None,
        "val_reward_start": first_val.get("val/reward"), "val_reward_end": last_val.get("val/reward"),
        "val_exact_start": first_val.get("val/exact"), "val_exact_end": last_val.get("val/exact"),
        "checkpoint": latest_checkpoint(out),
    }
    if ctx.is_main:
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        lines = [f"done: {summary['steps']} steps, output in {out}"]
        if k:
            lines.append(f"  train reward (mean of first/last {k} steps): "
                         f"{summary['train_reward_first']:.3f} -> {summary['train_reward_last']:.3f}")
        if first_val and last_val:
            lines.append(f"  validation reward (greedy, {len(val)} prompts): "
                         f"{summary['val_reward_start']:.3f} -> {summary['val_reward_end']:.3f}; "
                         f"exact {summary['val_exact_start']:.3f} -> {summary['val_exact_end']:.3f}")
        lines.append(f"  checkpoint: {summary['checkpoint']}")
        print("\n".join(lines), flush=True)
    return summary
