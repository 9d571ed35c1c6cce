import json

import pytest

from fastcrit.data.datasets import DatasetError, load_dataset
from fastcrit.data.tasks import make_reverse


def test_shipped_reverse_task_matches_its_generator():
    train = load_dataset("reverse")
    test = load_dataset("reverse:test")
    made = make_reverse()
    assert [e.prompt for e in train.examples] == [r["prompt"] for r in made["train"]]
    assert len(test) == 200 and not train.skipped
    assert not {e.prompt for e in train.examples} & {e.prompt for e in test.examples}
    ex = test.examples[0]
    letters = ex.prompt.split(": ")[1].split()
    assert ex.answer.split() == letters[::-1]


def test_bad_rows_are_counted_with_line_numbers(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [json.dumps({"prompt": "a", "answer": "b"}), "{not json", json.dumps([1, 2]),
            json.dumps({"answer": "x"}), "", json.dumps({"prompt": "c", "answer": 3, "extra": 1})]
    p.write_text("\n".join(rows) + "\n")
    d = load_dataset(str(p))
    assert [e.prompt for e in d.examples] == ["a", "c"]
    assert d.examples[1].answer == "3" and d.examples[1].meta == {"extra": 1}
    assert len(d.skipped) == 3
    assert d.skipped[0].endswith(":2: not valid JSON (Expecting property name enclosed in double quotes)")
    assert ":3: expected a JSON object" in d.skipped[1] and ":4: missing" in d.skipped[2]


def test_nothing_usable_or_unknown_source_is_a_clear_error(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("{}\n")
    with pytest.raises(DatasetError, match="no usable examples"):
        load_dataset(str(p))
    with pytest.raises(DatasetError, match="not a shipped task"):
        load_dataset("no-such-task")
    with pytest.raises(DatasetError, match="has no split"):
        load_dataset("reverse:dev")
