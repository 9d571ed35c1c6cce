"""Dataset rows that once crashed loading deep inside (a RecursionError, a ValueError, a TypeError
in the tokenizer, an AttributeError in `data prepare`) or loaded as a wrong reference answer; each
is now a counted skip naming the file, row and reason, or a DatasetError / ProblemError naming it."""

import json

import pytest

from fastcrit.data.datasets import DatasetError, load_dataset, load_preferences
from fastcrit.data.problem_files import load_problems, save_problems
from fastcrit.data.problems import Problem, ProblemError
from fastcrit.data.tasks import ANSWER_FORMATS, answer_format

GOOD = json.dumps({"prompt": "p", "answer": "a"})


def test_json_python_will_not_hold_is_a_skipped_row(tmp_path):
    p = tmp_path / "d.jsonl"
    deep = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError
    big = '{"prompt": "q", "answer": ' + "9" * 5000 + "}"  # json.loads: ValueError (int digits limit)
    p.write_text("\n".join([GOOD, deep, big, GOOD]) + "\n")
    d = load_dataset(str(p))
    assert len(d) == 2 and len(d.skipped) == 2
    assert d.skipped[0].endswith(":2: JSON nested too deep to read")
    assert ":3: a JSON number Python will not read (Exceeds the limit" in d.skipped[1]
    arr = tmp_path / "d.json"
    arr.write_text("[" + GOOD + ", " + deep + "]")
    with pytest.raises(DatasetError, match=r"d\.json: JSON nested too deep"):
        load_dataset(str(arr))


def test_a_directory_named_like_a_data_file_is_a_dataset_error(tmp_path):
    (tmp_path / "x.jsonl").mkdir()
    with pytest.raises(DatasetError, match=r"x\.jsonl: cannot read the file"):
        load_dataset(str(tmp_path / "x.jsonl"))


def test_answers_that_are_no_reference_are_skipped(tmp_path):
    # NaN / Infinity (Python's json reads them), a float overflow and a bool used to load as the
    # references "nan", "inf", "True"
    p = tmp_path / "d.jsonl"
    rows = ['{"prompt": "p", "answer": NaN}', '{"prompt": "p", "answer": Infinity}', '{"prompt": "p", "answer": 1e400}']
    rows += [json.dumps({"prompt": "p", "answer": True}), json.dumps({"prompt": "p", "answer": 2.5}), GOOD]
    p.write_text("\n".join(rows) + "\n")
    d = load_dataset(str(p))
    assert [e.answer for e in d.examples] == ["2.5", "a"]
    assert [s.split(": ", 1)[1] for s in d.skipped] == [
        "'answer' is nan (NaN, Infinity, or a number too large): not a usable answer",
        "'answer' is inf (NaN, Infinity, or a number too large): not a usable answer",
        "'answer' is inf (NaN, Infinity, or a number too large): not a usable answer",
        "'answer' must be a string or number, got bool",
    ]


def test_lone_surrogates_are_skipped_not_handed_to_the_tokenizer(tmp_path):
    # "\ud800" is valid JSON but no text: the tokenizer raised a TypeError on it, far from the row
    p = tmp_path / "d.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi\ud800"}, {"role": "assistant", "content": "ok"}]}
    rows = [json.dumps({"prompt": "p\ud800", "answer": "a"}), json.dumps({"prompt": "p", "answer": "\udc00"})]
    p.write_text("\n".join([*rows, json.dumps(chat), GOOD]) + "\n")
    d = load_dataset(str(p))
    assert len(d) == 1 and len(d.skipped) == 3 and all("lone surrogate" in s for s in d.skipped)
    prefs = tmp_path / "p.jsonl"
    pair = {"prompt": "p", "chosen": "a\ud800", "rejected": "b"}
    prefs.write_text(json.dumps(pair) + "\n" + json.dumps({**pair, "chosen": "a"}) + "\n")
    pairs, skipped = load_preferences(str(prefs))
    assert len(pairs) == 1 and len(skipped) == 1 and ":1: the text holds a lone surrogate" in skipped[0]


MBPP = {"task_id": 1, "text": "identity", "code": "def f(x): return x", "test_list": ["assert f(1) == 1"]}


def test_a_test_the_parser_cannot_hold_is_a_skipped_problem(tmp_path):
    # ast.parse raises MemoryError ("parser stack overflow") on 200 kB of "-": it escaped load_problems
    p = tmp_path / "mbpp.jsonl"
    bad = dict(MBPP, task_id=2, test_list=["assert f(" + "-" * 200_000 + "1) == 1"])
    p.write_text(json.dumps(MBPP) + "\n" + json.dumps(bad) + "\n")
    ps = load_problems(str(p))
    assert [x.id for x in ps.problems] == ["mbpp/1"]
    assert ps.skipped == [f"{p}:2: test 0 cannot be parsed (MemoryError: too deep)"]


def test_problem_fields_that_crashed_prepare_or_save_are_refused(tmp_path):
    base = dict(id="x", question="q", test_kind="assert", tests=["assert True"])
    with pytest.raises(ProblemError, match="x: 'meta' must be an object, got str"):  # prepare: meta.get
        Problem(**base, meta="hard")
    for field, value in (("question", "q\ud800"), ("solutions", ["a\ud800"]), ("tests", ["assert '\ud800'"])):
        with pytest.raises(ProblemError, match=f"x: '{field}': holds a lone surrogate"):
            Problem(**{**base, field: value})
    p = tmp_path / "fc.jsonl"
    p.write_text(json.dumps({**base, "id": "y", "question": "q\ud800"}) + "\n" + json.dumps(base) + "\n")
    ps = load_problems(str(p), "fastcrit")
    assert [x.id for x in ps.problems] == ["x"] and "lone surrogate" in ps.skipped[0]
    assert save_problems(ps, str(tmp_path / "out.jsonl")) == 1  # (save_problems raised UnicodeEncodeError)


def test_an_answer_format_that_is_not_a_string_is_an_unknown_format():
    # a list made `fmt not in ANSWER_FORMATS` raise TypeError (unhashable) in RARO's recipe
    fmt = answer_format({"answer_format": ["boxed"], "task": "math"})
    assert fmt == "['boxed']" and fmt not in ANSWER_FORMATS
    assert answer_format({"answer_format": "line"}) == "line" and answer_format({"task": "math"}) == "boxed"
