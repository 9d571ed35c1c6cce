"""RunLog's step bar (fastcrit train / sft / rm): drawn on a terminal, nothing when stderr is not one
(README: "none when stderr is not a terminal"), as the other commands' bars."""

from __future__ import annotations

import io
import json

from fastcrit.train.metrics import RunLog


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(tmp_path, monkeypatch, stream, progress=True):
    monkeypatch.setattr("sys.stderr", stream)
    with RunLog(str(tmp_path), enabled=True, total=3, start=0, progress=progress) as log:
        for step in (1, 2, 3):
            log.log({"step": step, "reward/mean": 0.5})
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # the metrics are written either way
    return stream.getvalue()


def test_no_bar_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    assert _run(tmp_path, monkeypatch, io.StringIO()) == ""


def test_bar_is_drawn_on_a_terminal(tmp_path, monkeypatch):
    out = _run(tmp_path, monkeypatch, _Tty())
    assert "train" in out and "3/3" in out


def test_progress_false_draws_nothing_even_on_a_terminal(tmp_path, monkeypatch):
    assert _run(tmp_path, monkeypatch, _Tty(), progress=False) == ""
