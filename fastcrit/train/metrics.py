"""metrics.jsonl (one JSON object per step), the trackers ``trainer.loggers`` names (TensorBoard, W&B:
fastcrit.train.trackers) and the progress bar; rank 0 writes, others no-op."""

from __future__ import annotations

import json
import math
import os
import sys

from tqdm import tqdm

from fastcrit.train.preempt import Stopped, stopped_at_once
from fastcrit.train.trackers import TrackerSettings, check_installed, open_trackers


def _step_of(line: str) -> float:
    """The ``step`` of a metrics line; infinity for a line that is not whole JSON (never kept)."""
    try:
        return json.loads(line).get("step", 0)
    except json.JSONDecodeError:
        return math.inf


class RunLog:
    """``start`` is the step the run continues from (lines after it are dropped); None defers that
    to ``restart_at`` (a run that learns its step from a checkpoint loaded later).

    ``trackers``: the trackers to open (at ``restart_at``) beside metrics.jsonl, each given every
    row ``log`` writes and the summary ``summary`` gets. Use it as a context manager, or call
    ``close``: the trackers must be closed on every way out (W&B then records the exit code)."""

    def __init__(
        self,
        output_dir: str,
        *,
        enabled: bool,
        total: int,
        start: int | None,
        progress: bool,
        desc: str = "train",
        show: dict[str, str] | None = None,
        trackers: TrackerSettings | None = None,
    ):
        self.enabled = enabled
        self.output_dir = output_dir
        self.settings = trackers if enabled else None
        self.trackers: list = []
        if self.settings is not None:
            check_installed(self.settings.loggers)  # now, not after the first step
        # progress-bar label -> metric key
        self.show = show or {"reward": "reward/mean", "tok/s": "throughput/tokens_per_s"}
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.bar = None
        self.total, self.progress, self.desc = total, progress, desc
        if enabled:
            os.makedirs(output_dir, exist_ok=True)
        if start is not None:
            self.restart_at(start)

    def restart_at(self, step: int) -> None:
        if not self.enabled:
            return
        self._truncate_after(step)
        if self.settings is not None and not self.trackers:
            self.trackers = open_trackers(self.settings, self.output_dir, step)
        if self.progress and self.bar is None:
            # disable=None: no bar when stderr is not a terminal (a log file gets no `\r` updates),
            # the rule of every other fastcrit bar (critique, sandbox run, data ...)
            self.bar = tqdm(
                total=self.total,
                initial=step,
                desc=self.desc,
                dynamic_ncols=True,
                file=sys.stderr,
                disable=None,
            )

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines of steps after the checkpoint (written before a crash) and a line
        cut short by a kill mid-write."""
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            lines = [ln for ln in f if ln.strip()]
        kept = [ln if ln.endswith("\n") else ln + "\n" for ln in lines if _step_of(ln) <= step]
        if kept != lines:
            with open(self.path + ".tmp", "w") as f:  # a kill mid-rewrite keeps the old file
                f.writelines(kept)
            os.replace(self.path + ".tmp", self.path)

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        for t in self.trackers:
            t.log(row["step"], row)
        if self.bar is not None:
            self.bar.update(1)
            post = {
                label: f"{row[key]:.3f}" if abs(row[key]) < 100 else f"{row[key]:.0f}"
                for label, key in self.show.items()
                if isinstance(row.get(key), float)
            }
            self.bar.set_postfix(post, refresh=False)

    def write(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def summary(self, step: int, summary: dict) -> None:
        """The run's summary (summary.json) to the trackers, at ``step``; the progress bar ends here."""
        self.close_bar()
        for t in self.trackers:
            t.summary(step, summary)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self, exit_code: int = 0) -> None:
        """End the progress bar and close every tracker (each once, even when one fails)."""
        self.close_bar()
        trackers, self.trackers, self.settings = self.trackers, [], None
        errors = []
        for t in trackers:
            try:
                t.close(exit_code)
            except Exception as e:  # the others still close
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        try:
            self.close(exit_code_of(exc))
        except Exception as e:
            if exc is None:
                raise
            # the run's own exception (or stop) is what the caller must see
            print(f"fastcrit: closing the trackers failed too: {e!r}", file=sys.stderr, flush=True)


def exit_code_of(exc: BaseException | None) -> int:
    """The exit code a run ending with ``exc`` has: 0, 128 + the signal of a stop, 130 for a Ctrl-C,
    1 for an error."""
    if exc is None:
        return 0
    if isinstance(exc, Stopped):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt) or stopped_at_once():  # a library may have wrapped the Ctrl-C
        return 130
    return 1
