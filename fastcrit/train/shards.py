"""Work that scales with a data set, dealt over ranks through files instead of collectives.

A stage such as CTRL's synthesis (generate and sandbox every training problem) takes hours on a
large set. A rank that waits for another one inside a collective hits the process group's timeout
(``trainer.dist_timeout_s``) long before that; so here nobody waits in a collective while others
work. Instead:

- The items of each split are cut into chunks of a fixed size (``cut``): the unit of work, of
  resume and of seeding. Chunk i of the whole list goes to rank i % world_size (``dealt``), so the
  ranks' shares differ by at most one chunk and no rank has to tell another which ones it took.
- A finished chunk is written to a temporary file (host and pid in its name), with a footer line
  naming the chunk and its row count, flushed, fsynced and renamed into place (``ChunkFiles.write``).
  A chunk file therefore exists only whole; a kill mid-chunk leaves a temporary file that nothing
  reads, and the chunk is done again. A chunk whose file exists is never done again, whichever rank
  wrote it and under whatever world size: a restart resumes from what is on disk, with the same or
  another number of ranks.
- ``plan.json`` holds the settings the chunks were made with (``ChunkFiles.settle_plan``); a
  restart with other settings stops with the keys that differ instead of mixing the two.
- Ranks wait for each other's chunks (and for whatever marks the stage done) by polling the
  directory (``wait_for``); one gives up with an error naming what is missing when nothing new has
  appeared for ``wait_s`` seconds (a rank that died unseen, or a directory it cannot see).

Not covered: the directory must be one that every rank sees (under torchrun on several machines,
``trainer.output_dir`` on a filesystem all nodes share) with atomic renames (local POSIX
filesystems and NFS have them); two runs writing one directory at once are not detected; the plan
compares settings, not model weights (a generator retrained in place is not noticed).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

PLAN = "plan.json"
POLL_S = 1.0  # how often a waiting rank looks at the directory


class ShardError(RuntimeError):
    """Chunk files that cannot be used as they are: another plan, a damaged file, a chunk that
    never came."""


@dataclass(frozen=True)
class Chunk:
    """Items ``start`` to ``stop - 1`` of one split."""

    split: str
    index: int  # its number within the split
    start: int
    stop: int

    @property
    def name(self) -> str:
        return f"{self.split}_{self.index:05d}"

    def __len__(self) -> int:
        return self.stop - self.start


def cut(sizes: Iterable[tuple[str, int]], per_chunk: int) -> list[Chunk]:
    """Every split's items in chunks of ``per_chunk`` (the last one of a split may be shorter), the
    splits in the order given."""
    if isinstance(per_chunk, bool) or not isinstance(per_chunk, int) or per_chunk < 1:
        raise ValueError(f"per_chunk={per_chunk!r} must be an integer >= 1")
    out = []
    for split, n in sizes:
        out += [Chunk(split, i, a, min(a + per_chunk, n)) for i, a in enumerate(range(0, n, per_chunk))]
    return out


def dealt(chunks: list[Chunk], rank: int, world_size: int) -> list[Chunk]:
    """Rank ``rank``'s share: chunks rank, rank + world_size, ..."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    return chunks[rank::world_size]


def fsync_path(path: str) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, lines: Iterable[str]) -> None:
    """``path`` holds ``lines`` whole, or is as it was: a temporary file, fsynced, renamed into place."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{socket.gethostname()}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(path))


class ChunkFiles:
    """The finished chunks of one stage: ``<directory>/<chunk name>.jsonl``, JSON rows and a footer."""

    def __init__(self, directory: str):
        self.directory = directory

    def path(self, chunk: Chunk) -> str:
        return os.path.join(self.directory, chunk.name + ".jsonl")

    def done(self, chunk: Chunk) -> bool:
        return os.path.exists(self.path(chunk))

    def missing(self, chunks: list[Chunk]) -> list[Chunk]:
        return [c for c in chunks if not self.done(c)]

    def count(self) -> int:
        """Finished chunk files now (what a waiting rank watches for progress); 0 without the directory."""
        try:
            return sum(n.endswith(".jsonl") and not n.startswith(".") for n in os.listdir(self.directory))
        except FileNotFoundError:
            return 0

    def write(self, chunk: Chunk, rows: list[dict]) -> None:
        """The chunk's rows, whole or not at all (see the module docstring)."""
        os.makedirs(self.directory, exist_ok=True)
        lines = [json.dumps(r) + "\n" for r in rows]
        lines.append(json.dumps({"chunk": chunk.name, "rows": len(rows)}) + "\n")
        write_atomically(self.path(chunk), lines)

    def read(self, chunk: Chunk) -> list[dict]:
        """The rows ``write`` wrote; a file without its footer, or with another count, raises."""
        path = self.path(chunk)
        with open(path) as f:
            lines = [line for line in f if line.strip()]
        try:
            rows = [json.loads(line) for line in lines]
        except json.JSONDecodeError as e:
            raise ShardError(f"{path}: not a chunk file ({e}); delete it to have the chunk done again") from None
        footer = rows.pop() if rows else None
        if footer != {"chunk": chunk.name, "rows": len(rows)}:
            raise ShardError(
                f'{path}: its last line should be {{"chunk": "{chunk.name}", "rows": '
                f"{len(rows)}}}, found {footer!r} (a damaged or foreign file); delete it to have "
                "the chunk done again"
            )
        return rows

    def settle_plan(self, plan: dict) -> None:
        """Write ``plan`` as the directory's plan, or check that it is the plan already there.
        Every rank calls this before it writes a chunk, so no chunk exists without its plan."""
        path = os.path.join(self.directory, PLAN)
        if os.path.exists(path):
            with open(path) as f:
                try:
                    old = json.load(f)
                except json.JSONDecodeError as e:
                    raise ShardError(f"{path}: not a plan ({e}); delete {self.directory} to start over") from None
            if old != plan:
                diff = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, a, b in _differences(old, plan))
                raise ShardError(
                    f"{self.directory} holds chunks made with other settings ({diff}). Restore "
                    f"the settings to resume, or delete {self.directory} to start the stage over"
                )
            return
        os.makedirs(self.directory, exist_ok=True)
        write_atomically(path, [json.dumps(plan, indent=1, sort_keys=True) + "\n"])


def _differences(a, b, prefix: str = "") -> list[tuple[str, object, object]]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += _differences(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [(prefix.rstrip("."), a, b)]


def wait_for(
    ready: Callable[[], bool],
    progress: Callable[[], object],
    *,
    wait_s: float,
    failure: Callable[[], str],
    poll_s: float = POLL_S,
) -> None:
    """Poll until ``ready()``; raise ShardError(``failure()``) once ``progress()`` has not changed
    for ``wait_s`` seconds (so a long stage that keeps moving never times out)."""
    if not wait_s > 0:
        raise ValueError(f"wait_s={wait_s!r} must be > 0")
    last, since = progress(), time.monotonic()
    while not ready():
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > wait_s:
            raise ShardError(failure())
        time.sleep(poll_s)


def missing_message(files: ChunkFiles, chunks: list[Chunk], world_size: int, wait_s: float, setting: str) -> str:
    """Which chunks never came, and the ranks they were dealt to."""
    gone = files.missing(chunks)
    ranks = sorted({chunks.index(c) % world_size for c in gone})
    names = ", ".join(c.name for c in gone[:8]) + (f" and {len(gone) - 8} more" if len(gone) > 8 else "")
    return (
        f"{files.directory}: no chunk appeared for {wait_s:g} s ({setting}) and {len(gone)} are missing "
        f"({names}), dealt to rank(s) {', '.join(map(str, ranks))} of {world_size}. Those ranks died, "
        "hang, or write where this one cannot see (every node must share trainer.output_dir); their "
        "own output says which. A restart resumes from the chunks on disk"
    )
