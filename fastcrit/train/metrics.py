"""metrics.jsonl (one JSON object per step) and the progress bar; rank 0 writes, others no-op."""
from __future__ import annotations

import json
import math
import os

from tqdm import tqdm


class RunLog:
    def __init__(self, output_dir: str, *, enabled: bool, total: int, start: int, progress: bool,
                 desc: str = "train"):
        self.enabled = enabled
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.bar = None
        if not enabled:
            return
        os.makedirs(output_dir, exist_ok=True)
        self._truncate_after(start)
        if progress:
            self.bar = tqdm(total=total, initial=start, desc=desc, dynamic_ncols=True)

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines of steps after the checkpoint (written before a crash)."""
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            lines = [ln for ln in f if ln.strip()]
        kept = [ln for ln in lines if json.loads(ln).get("step", 0) <= step]
        if len(kept) != len(lines):
            with open(self.path, "w") as f:
                f.writelines(kept)

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.bar is not None:
            self.bar.update(1)
            post = {"reward": f"{row.get('reward/mean', float('nan')):.3f}",
                    "tok/s": f"{row.get('throughput/tokens_per_s', 0):.0f}"}
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
