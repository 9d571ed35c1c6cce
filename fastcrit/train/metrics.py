"""metrics.jsonl (one JSON object per step) and the progress bar; rank 0 writes, others no-op."""
from __future__ import annotations

import json
import math
import os

from tqdm import tqdm


def _step_of(line: str) -> float:
    """The ``step`` of a metrics line; infinity for a line that is not whole JSON (never kept)."""
    try:
        return json.loads(line).get("step", 0)
    except json.JSONDecodeError:
        return math.inf


class RunLog:
    """``start`` is the step the run continues from (lines after it are dropped); None defers that
    to ``restart_at`` (a run that learns its step from a checkpoint loaded later)."""

    def __init__(self, output_dir: str, *, enabled: bool, total: int, start: int | None,
                 progress: bool, desc: str = "train", show: dict[str, str] | None = None):
        self.enabled = enabled
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
        if self.progress and self.bar is None:
            self.bar = tqdm(total=self.total, initial=step, desc=self.desc, dynamic_ncols=True)

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
        if self.bar is not None:
            self.bar.update(1)
            post = {label: f"{row[key]:.3f}" if abs(row[key]) < 100 else f"{row[key]:.0f}"
                    for label, key in self.show.items() if isinstance(row.get(key), float)}
            self.bar.set_postfix(post, refresh=False)

    def write(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
