"""Experiment trackers beside metrics.jsonl: TensorBoard and Weights & Biases (``trainer.loggers``).

``fastcrit.train.metrics.RunLog`` hands each tracker what it writes to metrics.jsonl, row by row
(the ``step`` of the row as the tracker's step, every numeric key under its own name: ``reward/mean``,
``val/reward``, ...), then the run's summary (summary.json's numbers, nested keys joined by ``/``,
under ``summary/``). Only the rank that writes metrics.jsonl (rank 0) opens trackers. Each package
is imported only when its tracker is named, and a named one whose package is missing stops the run
before it starts (``check_installed``: a ConfigError naming the key and the pip command).

- ``tensorboard``: tensorboardX's SummaryWriter (protobuf and numpy, none of TensorBoard's server),
  event files in ``<output_dir>/tensorboard``. A resumed run opens its writer with
  ``purge_step`` = the checkpoint's step + 1, so TensorBoard drops the rows an earlier process wrote
  after that checkpoint, as metrics.jsonl does. Strings (the summary's checkpoint path) go in one
  text entry, ``summary``.
- ``wandb``: one W&B run per launch and stage (``trainer.wandb_project``, ``trainer.wandb_name``,
  ``trainer.wandb_mode``), its files under ``<output_dir>/wandb``, the whole config as its config,
  the summary in ``run.summary``; finished with the process's exit code (0, 1 for an error, 143 /
  130 for a stop by SIGTERM / SIGINT), so W&B marks a failed or stopped run as such.

What is NOT done: a resumed run is a new W&B run (same name; its steps continue from the
checkpoint), not the continuation of the earlier one; values that are not numbers (a string, a
list) are left out of both trackers, as are rows the other ranks see (they log nothing).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from dataclasses import dataclass, field

from fastcrit.config import Config, ConfigError, to_dict

# tracker name -> (the module it imports, how to install it)
PACKAGES = {
    "tensorboard": ("tensorboardX", "pip install 'fastcrit[tensorboard]'  (or: pip install tensorboardX)"),
    "wandb": ("wandb", "pip install wandb"),
}


def check_installed(loggers, where: str = "trainer.loggers") -> None:
    """Raise ConfigError when a named tracker's package cannot be imported (without importing it)."""
    for name in loggers:
        if name not in PACKAGES:
            continue
        module, pip = PACKAGES[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a finder that refuses it; sys.modules[module] = None
            found = False
        if not found:
            raise ConfigError(f"{where} names {name!r}, whose package {module} is not installed: {pip}")


@dataclass(frozen=True)
class TrackerSettings:
    """What a RunLog needs to open its trackers: ``trainer.loggers`` and the W&B keys, for one stage."""

    loggers: tuple[str, ...]  # the trackers to open ("jsonl" is metrics.jsonl itself, left out here)
    stage: str = "train"  # "train" | "sft" | "rm": the W&B job type; other stages suffix the run name
    wandb_project: str = "fastcrit"
    wandb_name: str = ""
    wandb_mode: str = ""
    config: dict = field(default_factory=dict, compare=False)  # the run's whole config, for W&B

    @classmethod
    def of(cls, cfg: Config, stage: str = "train") -> TrackerSettings:
        t = cfg.trainer
        name = t.wandb_name or os.path.basename(os.path.normpath(t.output_dir))
        return cls(
            tuple(x for x in dict.fromkeys(t.loggers) if x != "jsonl"),
            stage,
            t.wandb_project,
            name if stage == "train" else f"{name}-{stage}",
            t.wandb_mode,
            to_dict(cfg),
        )


def open_trackers(settings: TrackerSettings | None, output_dir: str, start: int) -> list:
    """The trackers ``settings`` names, writing under ``output_dir``, for a run continuing after
    step ``start``. A tracker that fails to open closes those opened before it."""
    if settings is None:
        return []
    check_installed(settings.loggers)
    opened = []
    try:
        for name in settings.loggers:
            if name == "tensorboard":
                opened.append(TensorBoardTracker(os.path.join(output_dir, "tensorboard"), start))
            elif name == "wandb":
                opened.append(WandbTracker(settings, output_dir))
            else:
                raise ValueError(f"trainer.loggers: unknown logger {name!r}")
    except BaseException:
        for t in opened:
            t.close(1)
        raise
    return opened


def numbers(row: dict, prefix: str = "") -> dict[str, float]:
    """The numeric entries of ``row`` (bools as 0/1, nested mappings flattened with ``/``), without
    ``step``; NaN and infinities kept (metrics.jsonl writes them as null)."""
    out = {}
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(numbers(v, f"{key}/"))
        elif isinstance(v, (bool, int, float)) and not (prefix == "" and k == "step"):
            out[key] = float(v)
    return out


class TensorBoardTracker:
    def __init__(self, logdir: str, start: int):
        from tensorboardX import SummaryWriter

        # purge_step: TensorBoard hides what earlier files hold from this step on (rows logged after
        # the checkpoint this run resumed from, by the process that was stopped or crashed)
        # A file name of its own: tensorboardX names files by the second and the host, and a second
        # writer within the same second would overwrite the first one's file.
        self.writer = SummaryWriter(
            logdir, purge_step=start + 1 if start > 0 else None, filename_suffix=f".{time.time_ns()}.{os.getpid()}"
        )

    def log(self, step: int, row: dict) -> None:
        for k, v in numbers(row).items():
            self.writer.add_scalar(k, v, step)

    def summary(self, step: int, summary: dict) -> None:
        for k, v in numbers(summary).items():
            self.writer.add_scalar(f"summary/{k}", v, step)
        self.writer.add_text("summary", "```\n" + json.dumps(summary, indent=1, default=str) + "\n```", step)

    def close(self, exit_code: int = 0) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, s: TrackerSettings, output_dir: str):
        import wandb

        self.run = wandb.init(
            project=s.wandb_project,
            name=s.wandb_name,
            job_type=s.stage,
            dir=output_dir,
            mode=s.wandb_mode or None,
            config=s.config,
            reinit="finish_previous",
            settings=wandb.Settings(console="off"),
        )  # the console stays ours

    def log(self, step: int, row: dict) -> None:
        self.run.log(numbers(row), step=step)

    def summary(self, step: int, summary: dict) -> None:
        flat = numbers(summary, "summary/")
        flat.update({f"summary/{k}": v for k, v in summary.items() if isinstance(v, str)})
        self.run.summary.update(flat)

    def close(self, exit_code: int = 0) -> None:
        import wandb

        self.run.finish(exit_code=exit_code)
        # finish() returns before W&B's service has written the run's log to disk (an offline run's
        # file can still be 7 bytes then); shutting the service down waits for it. The next stage's
        # wandb.init starts a new one.
        wandb.teardown()
