"""The worker's channels: length-prefixed JSON frames with the pool (jobs in, results out), the
signed records an execution writes to its result pipe (checked here as they arrive; written by
``harness.Reporter``, whose field layout ``_decode`` reads), and the capped output tails."""

from __future__ import annotations

import json
import os
import struct

try:  # the built-in BLAKE2 module: hashlib would map OpenSSL into every warm worker (as in harness)
    from _blake2 import blake2b as _blake2b
except ImportError:  # pragma: no cover
    from hashlib import blake2b as _blake2b
from _operator import _compare_digest

_HDR = struct.Struct(">I")
_len = len


def read_frame(fd: int):
    hdr = _read_exact(fd, 4)
    if hdr is None:
        return None
    (n,) = _HDR.unpack(hdr)
    body = _read_exact(fd, n)
    if body is None:
        return None
    return json.loads(body)


def _read_exact(fd: int, n: int):
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, n - got)
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def write_frame(fd: int, obj) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    data = memoryview(_HDR.pack(len(body)) + body)
    while data:
        n = os.write(fd, data)
        data = data[n:]


def drain_tails(pairs, cap: int) -> None:
    """Read what each (pipe, Tail) pair still holds once its writers are gone; a Tail past
    ``cap`` bytes takes no more."""
    for fd, sink in pairs:
        os.set_blocking(fd, False)
        while True:
            try:
                b = os.read(fd, 1 << 16)
            except OSError:  # BlockingIOError included: nothing more
                break
            if not b:
                break
            if sink.total <= cap:
                sink.add(b)


class Tail:
    """Keeps the total byte count, the first ``keep_all`` bytes (stdio answers) and a tail."""

    def __init__(self, keep_all: int, tail: int):
        self.total = 0
        self.keep_all = keep_all
        self.head = bytearray()
        self.tail = bytearray()
        self.tail_max = tail

    def add(self, b: bytes):
        self.total += len(b)
        if len(self.head) < self.keep_all:
            self.head += b[: self.keep_all - len(self.head)]
        self.tail += b
        if len(self.tail) > 2 * self.tail_max:
            del self.tail[: len(self.tail) - self.tail_max]

    def tail_text(self) -> str:
        return bytes(self.tail[-self.tail_max :]).decode("utf-8", "replace")


def _decode(body: bytes) -> dict:
    """One record's fields. A returned value ``vj`` stays JSON text: the worker only passes it on
    to the pool (which decodes it), so a big value never becomes objects in the warm worker."""
    k, i, st, t, v, m = body.decode("utf-8", "replace").split("\x1f", 5)
    rec = {"k": k, "i": int(i), "s": st, "t": float(t), "m": m}
    if v:
        rec["vj"] = v
    return rec


class RecordReader:
    """Checks the signed records of one execution as their bytes arrive, in any pieces.

    ``feed`` returns the records completed by the new bytes. The first record that is malformed or
    badly signed sets ``tampered`` and nothing after it is read. Bytes after the last newline wait
    for the rest of their record; a record cut short because the execution ended is not a record.
    ``total`` counts every byte received."""

    def __init__(self, key: bytes):
        self._key = key
        self._seq = 0
        self._partial = bytearray()
        self.total = 0
        self.tampered = False

    def feed(self, data: bytes) -> list:
        self.total += _len(data)
        if self.tampered:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            self._partial += data
            return []
        if self._partial:
            self._partial += data[:end]
            lines = bytes(self._partial).split(b"\n")
        else:
            lines = data[:end].split(b"\n")
        self._partial = bytearray(data[end + 1 :])
        out = []
        for line in lines:
            body, sep, sig = line.rpartition(b"\t")
            mac = _blake2b(b"%d:" % self._seq + body, key=self._key, digest_size=16).hexdigest().encode()
            if not sep or not _compare_digest(mac, sig):
                self.tampered = True
                return out
            try:
                out.append(_decode(body))
            except ValueError:
                self.tampered = True
                return out
            self._seq += 1
        return out
