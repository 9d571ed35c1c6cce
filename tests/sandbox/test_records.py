"""The signed result channel between an execution and its worker."""
import os

from fastcrit.sandbox.harness import Reporter, verify_records


def _records(key, payloads):
    r, w = os.pipe()
    rep = Reporter(w, key)
    for p in payloads:
        rep.send(p)
    os.close(w)
    data = b""
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        data += b
    os.close(r)
    return data


def test_roundtrip_keeps_fields_and_values():
    key = os.urandom(32)
    data = _records(key, [{"k": "loaded"}, {"k": "test", "i": 0, "s": "passed", "m": "a\nb\x1fc", "v": [1, "x|y", None]}])
    recs, tampered = verify_records(data, key)
    assert not tampered and [r["k"] for r in recs] == ["loaded", "test"]
    assert recs[1]["i"] == 0 and recs[1]["s"] == "passed" and recs[1]["v"] == [1, "x|y", None]
    assert recs[1]["m"] == "a b c" and isinstance(recs[1]["t"], float)


def test_wrong_key_reordered_or_injected_records_are_rejected():
    key = os.urandom(32)
    good = _records(key, [{"k": "test", "i": 0, "s": "failed"}, {"k": "test", "i": 1, "s": "passed"}])
    assert verify_records(good, os.urandom(32)) == ([], True)  # another run's key
    first, second = good.split(b"\n")[:2]
    recs, tampered = verify_records(second + b"\n" + first + b"\n", key)  # replayed out of order
    assert tampered and recs == []
    forged = first + b"\n" + b"test\x1f1\x1fpassed\x1f0\x1f\x1f\t" + b"0" * 32 + b"\n"
    recs, tampered = verify_records(forged, key)
    assert tampered and [r["s"] for r in recs] == ["failed"]
    assert verify_records(b"garbage\n", key) == ([], True)
