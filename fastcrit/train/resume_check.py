"""Before a training run starts in an output directory that already holds a checkpoint: is this the
same run, continued, or something else?

``trainer.resume`` (the default) continues from the newest checkpoint in ``trainer.output_dir``.
That is right after a stop (the same settings, ``--resume``), and wrong when a user runs another
experiment into a directory a finished run left: the new settings would train on from the old
weights, and its ``config.yaml`` and ``summary.json`` would describe neither run. So the settings
that decide what is trained are compared with the run's saved ``config.yaml`` first, and a run
whose newest checkpoint is already at or past ``trainer.total_steps`` is not started at all.
"""

from __future__ import annotations

import json
import os

import yaml

from fastcrit.config import Config, to_dict
from fastcrit.train.checkpoint import complete_checkpoints

NEW_RUN = "set trainer.output_dir to a new directory for a new run"  # the way out of every refusal here

# Sections whose values decide what a step computes. Left out: trainer (but its seed and nproc),
# sandbox, and the rollout engine's placement and speed settings below, which a resumed run may
# change (a smaller micro-batch after an out-of-memory stop, another logger, more steps).
_COMPARED = ("model", "data", "rollout", "algorithm", "reward", "optim", "sft", "proxy", "ctrl", "pacs", "ppo", "rm")
_TRAINER_COMPARED = ("seed", "nproc")
_FREE = {
    "model.liger",
    "data.val",
    "data.val_size",
    "rollout.engine",
    "rollout.mem_fraction_static",
    "rollout.tp_size",
    "rollout.weight_bucket_mb",
    "rollout.engine_args",
}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if key in _FREE:
            continue
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _compared(d: dict) -> dict:
    picked = {k: d.get(k, {}) for k in _COMPARED}
    picked["trainer"] = {k: d.get("trainer", {}).get(k) for k in _TRAINER_COMPARED}
    return _flat(picked)


def differences(cfg: Config, saved_path: str) -> list[str]:
    """``key: saved -> now`` for each compared setting that differs from the saved config.yaml
    (empty when there is none: nothing to compare with). One that is there but unreadable raises
    ValueError naming it: skipping the comparison would continue any run into that directory."""
    if not os.path.exists(saved_path):
        return []
    try:
        with open(saved_path, "rb") as f:
            saved = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        reason = " ".join(str(getattr(e, "strerror", None) or e).split())
        saved = None
    else:
        reason = "it is empty" if saved is None else f"expected a mapping of settings, got {type(saved).__name__}"
    if not isinstance(saved, dict):
        raise ValueError(
            f"{saved_path}: the saved run's settings cannot be read ({reason}), so continuing it cannot be "
            f"checked; restore the file (or delete it to continue without the check), or {NEW_RUN}"
        )
    old, new = _compared(saved), _compared(to_dict(cfg))
    return [
        f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
        for k in sorted(set(old) | set(new))
        # an empty setting the run filled in before it saved config.yaml (CTRL's and RARO's
        # sft.data: the SFT rows their pre-stage wrote) is the same setting, not another one
        if old.get(k) != new.get(k)
        and new.get(k) not in ("", None, [], {})
        or (old.get(k) != new.get(k) and old.get(k) in ("", None, [], {}))
    ]


def check_resume(cfg: Config) -> tuple[str, int] | None:
    """None: start (there is no checkpoint to continue, or ``trainer.resume`` is off). ("finished",
    step): the newest checkpoint is at ``trainer.total_steps`` already, nothing to train. Raises
    ValueError when continuing would mix two runs: other settings than the saved ones, or a newest
    checkpoint past ``trainer.total_steps``."""
    t = cfg.trainer
    if not t.resume:
        return None
    done = complete_checkpoints(t.output_dir)
    if not done:
        return None
    step, ckpt = done[-1]
    diff = differences(cfg, os.path.join(t.output_dir, "config.yaml"))
    if diff:
        shown = "; ".join(diff[:8]) + (f"; and {len(diff) - 8} more" if len(diff) > 8 else "")
        raise ValueError(
            f"{t.output_dir} holds a run with other settings (newest checkpoint {ckpt}), and "
            f"trainer.resume would continue it with these: {shown}. To continue it, use its settings; "
            f"to train with these, {NEW_RUN}"
        )
    if step < t.total_steps:
        unreadable(ckpt, t.nproc)
    if step > t.total_steps:
        raise ValueError(
            f"trainer.total_steps={t.total_steps}, but {t.output_dir}'s newest checkpoint is at step {step}: "
            f"raise trainer.total_steps to train further, or {NEW_RUN}"
        )
    if step == t.total_steps:
        return "finished", step
    return None


def unreadable(ckpt: str, nproc: int) -> None:
    """Raise ValueError when the checkpoint a run would continue from lacks what
    fastcrit.train.checkpoint.load_checkpoint reads (its trainer_state.json, each rank's RNG
    state, the sharded model and optimizer state) or was saved by another number of processes:
    found once the ranks had started (after an SFT warm start where there was one) otherwise."""
    fix = f"delete that step_<N> directory to continue from the checkpoint before it, or {NEW_RUN}"
    try:
        with open(os.path.join(ckpt, "trainer_state.json"), "rb") as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{ckpt}: its trainer_state.json cannot be read ({' '.join(str(e).split())}); {fix}") from None
    saved = state.get("world_size") if isinstance(state, dict) else None
    if saved is not None and saved != nproc:
        raise ValueError(
            f"{ckpt}: saved with {saved} processes, continued with trainer.nproc={nproc}; set "
            f"trainer.nproc={saved} to continue it, or {NEW_RUN}"
        )
    missing = [
        n for n in ["dcp", *(f"rng_rank{r}.pt" for r in range(nproc))] if not os.path.exists(os.path.join(ckpt, n))
    ]
    if missing:
        raise ValueError(f"{ckpt}: has no {', '.join(missing)}, which continuing it reads; {fix}")
