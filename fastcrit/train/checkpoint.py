"""Checkpoints: a Hugging Face directory to load anywhere, plus what an exact resume needs.

``<output_dir>/checkpoints/step_<N>/`` holds
- ``config.json``, ``model.safetensors``, tokenizer files: `AutoModelForCausalLM.from_pretrained` loads it;
- ``dcp/``: model and optimizer state, sharded per rank (torch.distributed.checkpoint);
- ``trainer_state.json``: step, scheduler and the data position; ``rng_rank<r>.pt``: RNG states;
- ``COMPLETE``: written last; a directory without it is ignored on resume (a crash mid-save).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fastcrit.models.hf import save_pretrained_safetensors
from fastcrit.train.dist import DistContext, barrier
from fastcrit.train.actor import Actor
from fastcrit.train.policy import full_named_tensors

_STEP_RE = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, "checkpoints", f"step_{step}")


def latest_checkpoint(output_dir: str) -> str | None:
    root = os.path.join(output_dir, "checkpoints")
    if not os.path.isdir(root):
        return None
    done = []
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        if m and os.path.exists(os.path.join(root, name, "COMPLETE")):
            done.append((int(m.group(1)), os.path.join(root, name)))
    return max(done)[1] if done else None


def save_hf(actor: Actor, tokenizer, directory: str, ctx: DistContext) -> None:
    """Gather full weights (a collective) and let rank 0 write the Hugging Face directory."""
    state = dict(full_named_tensors(actor.module))
    if ctx.is_main:
        lm = actor.module.lm
        save_pretrained_safetensors(state, tokenizer, directory, config=lm.config,
                                    generation_config=getattr(lm, "generation_config", None))


def save_checkpoint(actor: Actor, tokenizer, ctx: DistContext, output_dir: str, step: int,
                    trainer_state: dict, extra_files: dict | None = None,
                    others: dict[str, Actor] | None = None) -> str:
    """``extra_files``: {file name: object} this rank saves with torch.save (e.g. a recipe's own
    state, such as a replay buffer); ``others``: {name: trainable model} saved like the policy in
    ``<checkpoint>/<name>/`` (e.g. PPO's critic: a Hugging Face directory plus its sharded
    optimizer state). All written before the COMPLETE marker."""
    path = checkpoint_dir(output_dir, step)
    if ctx.is_main and os.path.exists(path):
        shutil.rmtree(path)  # an incomplete leftover of the same step
    barrier()
    save_hf(actor, tokenizer, path, ctx)
    _save_state(actor, path)
    for name, other in (others or {}).items():
        save_hf(other, tokenizer, os.path.join(path, name), ctx)
        _save_state(other, os.path.join(path, name))
        if ctx.is_main:
            with open(os.path.join(path, name, "scheduler.json"), "w") as f:
                json.dump(other.scheduler.state_dict(), f)
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state()},
               os.path.join(path, f"rng_rank{ctx.rank}.pt"))
    for name, obj in (extra_files or {}).items():
        torch.save(obj, os.path.join(path, name))
    if ctx.is_main:
        state = dict(trainer_state, step=step, world_size=ctx.world_size,
                     scheduler=actor.scheduler.state_dict())
        with open(os.path.join(path, "trainer_state.json"), "w") as f:
            json.dump(state, f, indent=1)
    barrier()
    if ctx.is_main:
        open(os.path.join(path, "COMPLETE"), "w").close()
    barrier()
    return path


def _save_state(actor: Actor, path: str) -> None:
    msd, osd = get_state_dict(actor.module, actor.optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(path, "dcp"))


def _load_state(actor: Actor, path: str) -> None:
    msd, osd = get_state_dict(actor.module, actor.optimizer)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=os.path.join(path, "dcp"))
    set_state_dict(actor.module, actor.optimizer, model_state_dict=sd["model"],
                   optim_state_dict=sd["optim"])


def load_checkpoint(actor: Actor, ctx: DistContext, path: str,
                    others: dict[str, Actor] | None = None) -> dict:
    """Restore model, optimizer, scheduler and RNG from ``path`` (and each of ``others`` from its
    subdirectory); return the trainer state."""
    with open(os.path.join(path, "trainer_state.json")) as f:
        state = json.load(f)
    if state.get("world_size") != ctx.world_size:
        raise RuntimeError(f"{path}: saved with {state.get('world_size')} processes, resuming with "
                           f"{ctx.world_size}; set trainer.nproc to match (or trainer.resume=false)")
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
