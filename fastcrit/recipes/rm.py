"""`fastcrit rm`: a reward model from preference pairs, by the Bradley-Terry loss

    loss = -log sigmoid(r(prompt, chosen) - r(prompt, rejected)),   r = value head at the last token

on a copy of ``model.path`` (after the SFT warm start when ``sft.steps`` > 0, the same one
`fastcrit train` makes and reuses) with a value head (fresh on a causal LM). The result, ``<rm.output_dir>/final``,
is a Hugging Face ``*ForTokenClassification`` directory that the `model` reward manager loads
(``reward.model_path``, by default this one) and ``transformers`` loads back. Accuracy (chosen
scored above rejected) on the held-out pairs is measured before and after, printed, and written to
``summary.json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time

import torch
import torch.nn.functional as F

from fastcrit.config import Config, ConfigError
from fastcrit.config_values import rm_output_dir
from fastcrit.data.datasets import PreferencePair, load_dataset, load_preferences
from fastcrit.data.prompts import encode_prompts
from fastcrit.models.hf import load_tokenizer
from fastcrit.recipes.common import prepare_output_dir, resolve_model, step_indices
from fastcrit.recipes.sft import run_sft
from fastcrit.reward import RewardItem, get_reward_manager
from fastcrit.reward.model import pad_left, rm_ids
from fastcrit.rollout import make_engine
from fastcrit.train.actor import micro_slices, optimizer_step
from fastcrit.train.checkpoint import save_hf
from fastcrit.train.dist import DistContext, all_reduce_mean, barrier, stop_if_asked
from fastcrit.train.memory import return_memory
from fastcrit.train.metrics import RunLog
from fastcrit.train.shards import ChunkFiles, cut, dealt, missing_message, wait_for
from fastcrit.train.trackers import TrackerSettings
from fastcrit.train.value import build_value_actor, last_token_scores, last_token_values
from fastcrit.types import SamplingParams, scoring_temperature


def _encode(tok, pairs: list[PreferencePair]):
    rows = [rm_ids(tok, p.prompt, p.chosen) for p in pairs] + [rm_ids(tok, p.prompt, p.rejected) for p in pairs]
    return pad_left(rows, tok.pad_token_id)


def accuracy(actor, tok, pairs: list[PreferencePair], micro: int) -> dict[str, float]:
    ids, mask = _encode(tok, pairs)
    s = last_token_scores(actor, ids, mask, micro)
    c, r = s[: len(pairs)], s[len(pairs) :]
    return {"acc": float((c > r).float().mean()), "margin": float((c - r).mean())}


def ranked_pairs(prompts: list[str], answers: list[str], scores: list[float]) -> list[PreferencePair]:
    """Preference pairs from scored answers: every two different answers to the same prompt with
    different scores make a pair, the higher-scored one chosen (prompts in first-seen order)."""
    by_prompt: dict[str, list[tuple[float, str]]] = {}
    for p, t, s in zip(prompts, answers, scores):
        by_prompt.setdefault(p, []).append((s, t))
    pairs = []
    for prompt, group in by_prompt.items():
        for a in range(len(group)):
            for b in range(a + 1, len(group)):
                (sa, ta), (sb, tb) = group[a], group[b]
                if sa != sb and ta != tb:
                    hi, lo = (ta, tb) if sa > sb else (tb, ta)
                    pairs.append(PreferencePair(prompt, hi, lo))
    return pairs


def bradley_terry_step(actor, tok, batch: list[PreferencePair], micro: int, grad_clip: float) -> dict[str, float]:
    """One optimizer step of -log sigmoid(r(chosen) - r(rejected)) on ``batch`` (mean over pairs);
    returns this rank's loss, accuracy (chosen scored above rejected) and the optimizer's stats."""
    actor.optimizer.zero_grad(set_to_none=True)
    loss_sum, hits = 0.0, 0.0
    for sl in micro_slices(len(batch), micro):
        part = batch[sl]
        ids, mask = _encode(tok, part)
        v = last_token_values(actor, ids, mask)
        margin = v[: len(part)] - v[len(part) :]
        loss = -F.logsigmoid(margin).mean() * (len(part) / len(batch))
        loss.backward()
        loss_sum += loss.item()
        hits += float((margin > 0).float().sum())
    opt = optimizer_step(actor, grad_clip)
    return {"loss": loss_sum, "acc": hits / len(batch), **opt}


def on_policy_pairs(ctx: DistContext, cfg: Config, model_path: str, tok, out_dir: str):
    """The model's own answers, ranked by ``rm.label_reward``: for each prompt, every two sampled
    answers with different scores make a pair (higher score chosen). The same on every rank.

    The sampling is dealt over the ranks in chunks of ``rm.chunk_prompts`` prompts
    (fastcrit.train.shards): each rank samples and labels its chunks into
    ``<out_dir>/answers-<plan digest>/`` and, once every chunk is there, reads them all. Answer j of
    prompt i draws from ``trainer.seed + i * rm.samples_per_prompt + j`` in whichever chunk, and the
    chunks are cut the same under any world size, so the pairs are those of one process. A later run
    with the same settings reuses the chunks; other settings make another directory."""
    c = cfg.rm
    data = load_dataset(cfg.data.train, cfg.data.prompt_key, cfg.data.answer_key, strict=cfg.data.strict)
    prompts, too_long = encode_prompts(
        tok, data.examples[: c.prompts], system=cfg.data.system_prompt, max_len=cfg.data.max_prompt_len
    )
    # pairs need different answers: a greedy rollout.temperature samples at 1 here
    params = SamplingParams(
        n=c.samples_per_prompt,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=scoring_temperature(cfg.rollout.temperature),
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        seed=cfg.trainer.seed,
    )
    ids = hashlib.sha256(json.dumps([p.ids for p in prompts]).encode()).hexdigest()
    plan = {
        "model": model_path,
        "engine": cfg.rollout.engine,
        "dtype": cfg.model.dtype,
        "prompts": ids,
        "label_reward": c.label_reward,
        "chunk_prompts": c.chunk_prompts,
        "sampling": dataclasses.asdict(params),
    }
    digest = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:12]
    files = ChunkFiles(os.path.join(out_dir, f"answers-{digest}"))
    files.settle_plan(plan)
    chunks = cut([("prompts", len(prompts))], c.chunk_prompts)
    mine = [ch for ch in dealt(chunks, ctx.rank, ctx.world_size) if not files.done(ch)]
    if mine:
        _sample_chunks(ctx, cfg, model_path, tok, prompts, params, files, mine)
    wait_for(
        lambda: not files.missing(chunks),
        files.count,
        wait_s=cfg.trainer.stage_wait_s,
        failure=lambda: missing_message(
            files, chunks, ctx.world_size, cfg.trainer.stage_wait_s, "trainer.stage_wait_s"
        ),
    )
    rows = [r for ch in chunks for r in files.read(ch)]
    texts, scores = [r["answer"] for r in rows], [r["score"] for r in rows]
    pairs = ranked_pairs([prompts[r["prompt"]].example.prompt for r in rows], texts, scores)
    if not pairs:
        raise ConfigError(
            f"rm.label_reward {c.label_reward!r}: the answers to each prompt all scored alike "
            f"({len(texts)} answers), so there is no pair to learn from (raise "
            "rollout.temperature or rm.samples_per_prompt, or warm-start with sft.steps)"
        )
    if ctx.is_main:
        with open(os.path.join(out_dir, "pairs.jsonl"), "w") as f:
            for p in pairs:
                f.write(json.dumps(dataclasses.asdict(p)) + "\n")
    info = {"answers": len(texts), "prompts": len(prompts), "label_mean": sum(scores) / len(scores)}
    return pairs, data.skipped + too_long, info


def _sample_chunks(
    ctx: DistContext, cfg: Config, model_path: str, tok, prompts, params: SamplingParams, files: ChunkFiles, chunks
) -> None:
    """This rank's chunks of prompts: sampled, labelled, each written as soon as it is done."""
    engine = make_engine(cfg.rollout, model_path, dtype=cfg.model.dtype, device=ctx.device, seed=cfg.trainer.seed)
    label = get_reward_manager(cfg.rm.label_reward)
    try:
        for ch in chunks:
            part = prompts[ch.start : ch.stop]
            rollouts = engine.generate(
                [p.ids for p in part], dataclasses.replace(params, seed=params.seed + ch.start * params.n)
            )
            texts = [tok.decode(r.output_ids, skip_special_tokens=True) for r in rollouts]
            items = [
                RewardItem(
                    part[r.prompt_index].example.prompt,
                    t,
                    part[r.prompt_index].example.answer,
                    part[r.prompt_index].example.meta,
                )
                for r, t in zip(rollouts, texts)
            ]
            files.write(
                ch,
                [
                    {"prompt": ch.start + r.prompt_index, "answer": t, "score": float(s.score)}
                    for r, t, s in zip(rollouts, texts, label(items))
                ],
            )
            print(f"rm: rank {ctx.rank}: sampled prompts {ch.start}-{ch.stop - 1}", flush=True)
    finally:
        engine.close()
        if hasattr(label, "close"):  # a code label holds a sandbox pool
            label.close()


def run_rm(ctx: DistContext, cfg: Config) -> dict:
    c = cfg.rm
    out_dir = rm_output_dir(cfg)
    torch.manual_seed(cfg.trainer.seed + ctx.rank)
    prepare_output_dir(cfg, ctx, out_dir)
    model_path = resolve_model(cfg, ctx)
    if cfg.sft.steps > 0:  # the backbone starts from the run's SFT warm start (reused once done)
        model_path = run_sft(ctx, cfg, model_path)
    tok = load_tokenizer(model_path)
    sampled = {}
    if c.label_reward:
        pairs, skipped, sampled = on_policy_pairs(ctx, cfg, model_path, tok, out_dir)
    else:
        pairs, skipped = load_preferences(c.data, strict=cfg.data.strict)
    random.Random(cfg.trainer.seed).shuffle(pairs)
    n_val = max(1, int(len(pairs) * c.val_fraction))
    val, train = pairs[:n_val], pairs[n_val:]
    if len(train) < c.batch_size:
        raise ValueError(f"rm.data {c.data!r}: {len(train)} training pairs, fewer than rm.batch_size={c.batch_size}")
    with RunLog(
        out_dir,
        enabled=ctx.is_main,
        total=c.steps,
        start=0,
        progress=cfg.trainer.progress,
        desc="rm",
        show={"loss": "rm/loss", "acc": "rm/acc"},
        trackers=TrackerSettings.of(cfg, "rm"),
    ) as log:  # closed on every way out
        for msg in skipped:
            log.write(f"rm: skipped {msg}")
        if sampled:
            log.write(
                f"rm: {len(pairs)} on-policy pairs from {sampled['answers']} answers to {sampled['prompts']} "
                f"prompts (mean {c.label_reward} score {sampled['label_mean']:.3f})"
            )
        optim = dataclasses.replace(cfg.optim, lr=c.lr, warmup_steps=c.warmup_steps)
        actor = build_value_actor(
            model_path,
            dtype=cfg.model.dtype,
            device=ctx.device,
            world_size=ctx.world_size,
            optim=optim,
            total_updates=c.steps,
            checkpointing=cfg.trainer.gradient_checkpointing,
            compile=cfg.trainer.compile,
        )
        micro = cfg.trainer.micro_batch_size
        start = accuracy(actor, tok, val, micro)
        log.write(
            f"rm: {len(train)} training pairs, {len(val)} held out; held-out accuracy at the start {start['acc']:.3f}"
        )
        for step in range(1, c.steps + 1):
            t0 = time.perf_counter()
            idx = step_indices(len(train), c.batch_size, step, cfg.trainer.seed, ctx.rank, ctx.world_size)
            out = bradley_terry_step(actor, tok, [train[i] for i in idx], micro, cfg.optim.grad_clip)
            loss, acc = out.pop("loss"), out.pop("acc")
            stats = all_reduce_mean({"rm/loss": loss, "rm/acc": acc})
            log.log(
                {
                    "step": step,
                    **stats,
                    **{f"rm/{k}": v for k, v in out.items()},
                    "time/step_s": time.perf_counter() - t0,
                }
            )
            if step < c.steps:  # SIGTERM / SIGINT: stop here, unsaved (a rerun trains it over)
                stop_if_asked()
        end = accuracy(actor, tok, val, micro)
        final = os.path.join(out_dir, "final")
        save_hf(actor, tok, final, ctx, cfg.model.dtype)
        del actor  # training comes next: this model's shards and optimizer state go
        return_memory(ctx.device)
        summary = {
            "pairs_train": len(train),
            "pairs_val": len(val),
            "skipped_rows": len(skipped),
            **({f"sampled_{k}": v for k, v in sampled.items()}),
            "val_acc_start": start["acc"],
            "val_acc_end": end["acc"],
            "val_margin_start": start["margin"],
            "val_margin_end": end["margin"],
            "model": final,
        }
        barrier()
        log.summary(c.steps, summary)
        if ctx.is_main:
            open(os.path.join(final, "COMPLETE"), "w").close()
            with open(os.path.join(out_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
            print(
                f"rm: held-out accuracy {start['acc']:.3f} -> {end['acc']:.3f} "
                f"(chosen scored above rejected, {len(val)} pairs); reward model: {final}",
                flush=True,
            )
    barrier()
    return summary
