"""Preference files: bad rows are reported by file and line and skipped, never a crash."""

import json

import pytest

from fastcrit.data.datasets import DatasetError, load_preferences


def test_bad_rows_are_reported_and_skipped(tmp_path):
    path = tmp_path / "prefs.jsonl"
    rows = [
        {"prompt": "p", "chosen": "a", "rejected": "b"},
        {"prompt": "p", "chosen": "a"},
        {"prompt": "p", "chosen": "same", "rejected": "same"},
        "not an object",
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    pairs, skipped = load_preferences(str(path))
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("p", "a", "b")]
    assert [s.split(": ", 1)[0].rsplit(":", 1)[1] for s in skipped] == ["2", "3", "4", "5"]
    assert "missing or non-string 'rejected'" in skipped[0] and "the same text" in skipped[1]


def test_a_file_without_pairs_is_an_error_naming_it(tmp_path):
    path = tmp_path / "none.jsonl"
    path.write_text(json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(DatasetError, match="no usable preference pairs"):
        load_preferences(str(path))
