"""The signed result channel between an execution and its worker."""

import json
import os
import tempfile

from fastcrit.sandbox.channels import RecordReader
from fastcrit.sandbox.harness import Reporter


def _records(key, payloads):
    with tempfile.TemporaryFile() as fh:  # a file, not a pipe: a big record would fill a pipe
        rep = Reporter(fh.fileno(), key)
        for p in payloads:
            rep.send(p)
        fh.seek(0)
        return fh.read()


def verify(data, key, piece=None):
    """All records of ``data``, fed at once or ``piece`` bytes at a time, and whether it was
    tampered with."""
    reader = RecordReader(key)
    if piece is None:
        recs = reader.feed(data)
    else:
        recs = []
        for i in range(0, len(data), piece):
            recs += reader.feed(data[i : i + piece])
    assert reader.total == len(data)
    return recs, reader.tampered


def test_roundtrip_keeps_fields_and_values():
    key = os.urandom(32)
    data = _records(
        key, [{"k": "loaded"}, {"k": "test", "i": 0, "s": "passed", "m": "a\nb\x1fc", "v": [1, "x|y", None]}]
    )
    recs, tampered = verify(data, key)
    assert not tampered and [r["k"] for r in recs] == ["loaded", "test"]
    # The value stays JSON text: the worker passes it on, the pool decodes it.
    assert recs[1]["i"] == 0 and recs[1]["s"] == "passed" and json.loads(recs[1]["vj"]) == [1, "x|y", None]
    assert recs[1]["m"] == "a b c" and isinstance(recs[1]["t"], float)


def test_records_arriving_in_pieces_are_read_as_they_complete():
    """The worker reads the pipe as it fills: a record may arrive in any number of pieces, and is
    taken in the moment its last byte arrives."""
    key = os.urandom(32)
    big = list(range(100_000))
    payloads = [{"k": "loaded"}, {"k": "test", "i": 0, "s": "passed", "v": big}, {"k": "test", "i": 1, "s": "failed"}]
    data = _records(key, payloads)
    for piece in (1, 7, 4096, 65536):
        recs, tampered = verify(data, key, piece)
        assert not tampered and [r["k"] for r in recs] == ["loaded", "test", "test"], piece
        assert json.loads(recs[1]["vj"]) == big and recs[2]["s"] == "failed"
    reader = RecordReader(key)
    first_end = data.index(b"\n") + 1
    assert [r["k"] for r in reader.feed(data[: first_end + 10])] == ["loaded"]
    assert reader.feed(data[first_end + 10 : first_end + 20]) == []  # the value is still coming


def test_a_record_cut_short_is_no_record_and_no_tampering():
    """An execution killed while writing (timeout, a limit) leaves half a record: it is not a
    record, and it does not void the records before it."""
    key = os.urandom(32)
    data = _records(key, [{"k": "loaded"}, {"k": "test", "i": 0, "s": "passed", "v": "x" * 1000}])
    recs, tampered = verify(data[:-100], key)
    assert not tampered and [r["k"] for r in recs] == ["loaded"]


def test_wrong_key_reordered_or_injected_records_are_rejected():
    key = os.urandom(32)
    good = _records(key, [{"k": "test", "i": 0, "s": "failed"}, {"k": "test", "i": 1, "s": "passed"}])
    assert verify(good, os.urandom(32)) == ([], True)  # another run's key
    first, second = good.split(b"\n")[:2]
    recs, tampered = verify(second + b"\n" + first + b"\n", key)  # replayed out of order
    assert tampered and recs == []
    forged = first + b"\n" + b"test\x1f1\x1fpassed\x1f0\x1f\x1f\t" + b"0" * 32 + b"\n"
    recs, tampered = verify(forged, key)
    assert tampered and [r["s"] for r in recs] == ["failed"]
    recs, tampered = verify(first + b"\n\n" + second + b"\n", key)  # an empty line slipped in
    assert tampered and [r["s"] for r in recs] == ["failed"]
    assert verify(b"garbage\n", key) == ([], True)
    # Once tampered, nothing more is read, however valid.
    reader = RecordReader(key)
    assert reader.feed(b"garbage\n") == [] and reader.feed(good) == [] and reader.tampered
