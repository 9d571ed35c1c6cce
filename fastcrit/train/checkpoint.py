"""Checkpoints: a Hugging Face directory to load anywhere, plus what an exact resume needs.

``<output_dir>/checkpoints/step_<N>/`` holds
- ``config.json``, ``model.safetensors``, tokenizer files: `AutoModelForCausalLM.from_pretrained` loads it,
  in transformers 4.51-4.57 as in 5 (``fastcrit.models.hf.make_portable``); ``fastcrit export`` copies
  this part alone;
- ``dcp/``: model and optimizer state, sharded per rank (torch.distributed.checkpoint);
- ``trainer_state.json``: step, scheduler and the data position; ``rng_rank<r>.pt``: RNG states;
- ``COMPLETE``: written last (kept for directories saved before the rename below, which have no
  other sign of being whole; a ``step_<N>`` without it is a crash mid-save of such a version).

A checkpoint is written to ``checkpoints/.tmp_step_<N>/`` and renamed to ``step_<N>`` once every
rank has written its part and rank 0 has flushed every file to disk (fsync of the files, the
directory, and the parent after the rename), so ``step_<N>`` only ever exists complete, whenever
the process is killed. Left-overs of a killed save (``.tmp_*`` directories, a ``step_<N>`` without
``COMPLETE``) are removed at the next start (`clean_checkpoints`). ``keep_last`` prunes older
checkpoints after each save, never the one just written.

Every file gets the mode of a normally created one (0o666 less the umask), the weights included.

What this does NOT cover: a file system that loses renames or fsynced data (some network file
systems), or two runs writing one output directory at once.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fastcrit.models.hf import parse_dtype, save_pretrained_safetensors, share_files
from fastcrit.train.actor import Actor
from fastcrit.train.dist import DistContext, barrier
from fastcrit.train.policy import gathered_buckets
from fastcrit.train.shards import fsync_path

_STEP_RE = re.compile(r"^step_(\d+)$")
_TMP = ".tmp_"  # .tmp_step_<N>: being written; .tmp_old_step_<N>: being deleted


def checkpoint_dir(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, "checkpoints", f"step_{step}")


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "COMPLETE"))


def complete_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint of ``output_dir``, oldest first."""
    root = os.path.join(output_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    done = []
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        if m and is_complete(os.path.join(root, name)):
            done.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(done)


def latest_checkpoint(output_dir: str) -> str | None:
    done = complete_checkpoints(output_dir)
    return done[-1][1] if done else None


def resume_output_dir(path: str) -> str:
    """``fastcrit train --resume PATH``: the output directory to continue. ``PATH`` is a run's
    ``trainer.output_dir`` holding a complete checkpoint, or its newest complete
    ``checkpoints/step_<N>``; anything else raises ValueError naming the path."""
    path = os.path.normpath(path)
    if not os.path.isdir(path):
        raise ValueError(f"--resume {path}: no such directory")
    if _STEP_RE.match(os.path.basename(path)) and os.path.basename(os.path.dirname(path)) == "checkpoints":
        out = os.path.dirname(os.path.dirname(path)) or "."
        if not is_complete(path):
            raise ValueError(f"--resume {path}: not a complete checkpoint (no COMPLETE marker)")
        newest = latest_checkpoint(out)
        if os.path.normpath(newest) != path:
            # Continuing from an older step would leave the newer checkpoints, of another history,
            # for the next automatic resume to pick up.
            raise ValueError(
                f"--resume {path}: the run's newest checkpoint is {newest}; a run resumes from its newest only"
            )
        return out
    if latest_checkpoint(path) is None:
        raise ValueError(
            f"--resume {path}: no complete checkpoint in {os.path.join(path, 'checkpoints')} "
            f"(give a previous run's trainer.output_dir)"
        )
    return path


def _discard(path: str) -> None:
    """Delete a checkpoint directory: renamed out of the ``step_<N>`` namespace first, so a kill
    mid-delete leaves a ``.tmp_`` directory (removed at the next start), not a half ``step_<N>``."""
    trash = os.path.join(os.path.dirname(path), f"{_TMP}old_{os.path.basename(path)}")
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(path, trash)
    shutil.rmtree(trash)


def remove_partial_checkpoints(output_dir: str) -> list[str]:
    """Delete what killed saves left in ``<output_dir>/checkpoints`` (``.tmp_*`` directories and
    ``step_<N>`` without ``COMPLETE``); return their paths. One process only, none saving."""
    root = os.path.join(output_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    removed = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            continue
        if name.startswith(_TMP):
            shutil.rmtree(path)
            removed.append(path)
        elif _STEP_RE.match(name) and not is_complete(path):
            _discard(path)
            removed.append(path)
    return removed


def clean_checkpoints(ctx: DistContext, output_dir: str) -> list[str]:
    """`remove_partial_checkpoints` on rank 0 while the others wait; the removed paths (rank 0)."""
    removed = remove_partial_checkpoints(output_dir) if ctx.is_main else []
    barrier()
    return removed


def prune_checkpoints(output_dir: str, keep_last: int | None, step: int) -> list[str]:
    """Keep the newest ``keep_last`` complete checkpoints up to ``step`` (the one just written,
    always kept); delete the older ones and return their paths. ``keep_last`` 0 or None keeps all.
    Checkpoints of later steps than ``step`` (left in the directory by an earlier run with
    trainer.resume=false) are not touched."""
    if not keep_last:
        return []
    done = [(s, p) for s, p in complete_checkpoints(output_dir) if s < step]
    old = done[: max(0, len(done) - (keep_last - 1))]
    for _, path in old:
        _discard(path)
    return [p for _, p in old]


def _fsync_tree(root: str) -> None:
    """Flush every file under ``root`` and every directory (their entries) to disk."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(dirpath, name))
        fsync_path(dirpath)


# Saves gather this many bytes of full tensors at a time (one all-gather each).
SAVE_BUCKET_BYTES = 256 << 20


def save_hf(
    actor: Actor,
    tokenizer,
    directory: str,
    ctx: DistContext,
    dtype: str | torch.dtype | None = None,
    bucket_bytes: int = SAVE_BUCKET_BYTES,
) -> None:
    """Write the Hugging Face directory of ``actor``'s model (a collective; rank 0 writes): the
    weights are gathered a bucket at a time (``gathered_buckets``, in ``dtype``: the model's own,
    e.g. bf16 for a bf16 run, whose fp32 master weights stay in the sharded state; None keeps
    them as they are) and rank 0 moves each bucket to host memory at once, so a device holds
    about one bucket of full tensors, never the whole model, and the other ranks nothing beyond
    their shards. Rank 0's host memory holds the model in ``dtype`` while the file is written."""
    dt = None if dtype is None else parse_dtype(dtype)
    state: dict[str, torch.Tensor] = {}
    for bucket in gathered_buckets(actor.module, dt, bucket_bytes):
        if ctx.is_main:
            for name, t in bucket:
                state[name] = t.to("cpu") if t.device.type != "cpu" else t
        del bucket
    if ctx.is_main:
        lm = actor.module.lm
        config = lm.config
        if dt is not None:  # the file's dtype, as Hugging Face records it
            config = copy.deepcopy(config)
            config.dtype = dt
        save_pretrained_safetensors(
            state, tokenizer, directory, config=config, generation_config=getattr(lm, "generation_config", None)
        )


def save_checkpoint(
    actor: Actor,
    tokenizer,
    ctx: DistContext,
    output_dir: str,
    step: int,
    trainer_state: dict,
    extra_files: dict | None = None,
    others: dict[str, Actor] | None = None,
    keep_last: int | None = None,
    dtype: str | None = None,
) -> str:
    """Write ``checkpoints/step_<step>`` (atomically: see the module docstring), then prune to
    ``keep_last``; return its path. ``extra_files``: {file name: object} this rank saves with
    torch.save (e.g. a recipe's own state, such as a replay buffer); ``others``: {name: trainable
    model} saved like the policy in ``<checkpoint>/<name>/`` (e.g. PPO's critic: a Hugging Face
    directory plus its sharded optimizer state). A complete ``step_<step>`` already there (a run
    restarted with trainer.resume=false) is replaced. ``dtype``: the Hugging Face weights' dtype
    (``save_hf``); the sharded state keeps the fp32 master weights either way."""
    final = checkpoint_dir(output_dir, step)
    path = os.path.join(os.path.dirname(final), f"{_TMP}step_{step}")  # the same on every rank
    if ctx.is_main:
        shutil.rmtree(path, ignore_errors=True)  # a leftover of a killed save of the same step
        os.makedirs(path)
    barrier()
    save_hf(actor, tokenizer, path, ctx, dtype)
    _save_state(actor, path)
    for name, other in (others or {}).items():
        save_hf(other, tokenizer, os.path.join(path, name), ctx, dtype)
        _save_state(other, os.path.join(path, name))
        if ctx.is_main:
            with open(os.path.join(path, name, "scheduler.json"), "w") as f:
                json.dump(other.scheduler.state_dict(), f)
    torch.save(
        {"python": random.getstate(), "torch": torch.get_rng_state()}, os.path.join(path, f"rng_rank{ctx.rank}.pt")
    )
    for name, obj in (extra_files or {}).items():
        torch.save(obj, os.path.join(path, name))
    if ctx.is_main:
        state = dict(trainer_state, step=step, world_size=ctx.world_size, scheduler=actor.scheduler.state_dict())
        with open(os.path.join(path, "trainer_state.json"), "w") as f:
            json.dump(state, f, indent=1)
    barrier()  # every rank's files are written
    if ctx.is_main:
        open(os.path.join(path, "COMPLETE"), "w").close()
        share_files(path)  # every file as readable as the umask allows, whatever library wrote it
        _fsync_tree(path)
        if os.path.exists(final):
            _discard(final)
        os.rename(path, final)
        fsync_path(os.path.dirname(final))
        prune_checkpoints(output_dir, keep_last, step)
    barrier()
    return final


def _save_state(actor: Actor, path: str) -> None:
    msd, osd = get_state_dict(actor.module, actor.optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(path, "dcp"))


def _load_state(actor: Actor, path: str) -> None:
    msd, osd = get_state_dict(actor.module, actor.optimizer)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=os.path.join(path, "dcp"))
    set_state_dict(actor.module, actor.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def load_checkpoint(actor: Actor, ctx: DistContext, path: str, others: dict[str, Actor] | None = None) -> dict:
    """Restore model, optimizer, scheduler and RNG from ``path`` (and each of ``others`` from its
    subdirectory); return the trainer state."""
    with open(os.path.join(path, "trainer_state.json")) as f:
        state = json.load(f)
    if state.get("world_size") != ctx.world_size:
        raise RuntimeError(
            f"{path}: saved with {state.get('world_size')} processes, resuming with "
            f"{ctx.world_size}; set trainer.nproc to match (or trainer.resume=false)"
        )
    _load_state(actor, path)
    actor.scheduler.load_state_dict(state["scheduler"])
    for name, other in (others or {}).items():
        sub = os.path.join(path, name)
        if not os.path.isdir(os.path.join(sub, "dcp")):
            raise RuntimeError(f"{path}: has no saved {name!r} to resume (was it saved by another recipe?)")
        _load_state(other, sub)
        with open(os.path.join(sub, "scheduler.json")) as f:
            other.scheduler.load_state_dict(json.load(f))
    rng = torch.load(os.path.join(path, f"rng_rank{ctx.rank}.pt"), weights_only=False)
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    return state
