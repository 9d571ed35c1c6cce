"""``fastcrit data prepare``: a TACO-layout training set filtered as the CTRL paper does."""

import json

import pytest

from fastcrit.data.cli import main as data_main
from fastcrit.data.prepare import RULES, has_image, normalise, prepare
from fastcrit.data.problem_files import load_problems
from fastcrit.data.problems import Problem

EXTRA = {
    "raw_tags": "[]",
    "name": None,
    "source": "codechef",
    "tags": "[]",
    "skill_types": "[]",
    "Expected Auxiliary Space": None,
    "time_limit": "1 seconds",
    "date": None,
    "picture_num": None,
    "memory_limit": "50000 bytes",
    "Expected Time Complexity": None,
    "difficulty": "EASY",
    "url": "u",
}


def taco(question: str, **kw) -> dict:
    row = {
        "question": question,
        "solutions": json.dumps(["print(int(input()) * 2)"]),
        "starter_code": "",
        "input_output": json.dumps({"inputs": ["1\n", "5\n"], "outputs": ["2\n", "10\n"]}),
        **EXTRA,
    }
    row.update(kw)
    return row


ROWS = [
    taco("Read an integer n and print twice n."),  # kept
    taco("Read an integer N and print  twice N!"),  # duplicate of 0 once normalised
    taco("Look at the figure <img src='a.png'> and print twice n."),  # image (a tag)
    taco("Print twice n, as the picture shows.", picture_num="2"),  # image (TACO's count)
    taco("Print twice n. " + "Pad " * 3000),  # too long
    taco("No tests here.", input_output=json.dumps({"inputs": [], "outputs": []})),  # not converted
    # HumanEval/0 (has_close_elements) copied, its doctests as the examples
    taco(
        "Check if in given list of numbers, are any two numbers closer to each other than given threshold. "
        ">>> has_close_elements([1.0, 2.0, 3.0], 0.5) False "
        ">>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) True. Read the list and print the answer."
    ),
    # shares only boilerplate with HumanEval/0: kept
    taco("Given list of numbers print the largest. The first line contains an integer t, the number of cases."),
]


def write(tmp_path, rows) -> str:
    path = tmp_path / "taco.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_rules_in_order_with_counts(tmp_path):
    ps = load_problems(write(tmp_path, ROWS))
    assert ps.format == "taco" and len(ps.skipped) == 1  # the row without tests never converts
    he = load_problems("humaneval")
    out = prepare(ps.problems, exclude=he.problems)
    assert [p.question[:20] for p in out.problems] == [ROWS[0]["question"][:20], ROWS[7]["question"][:20]]
    assert out.removed == {"image": 2, "too_long": 1, "duplicate": 1, "overlap": 1}
    assert out.examples["overlap"][0].startswith("taco/6 (HumanEval/0, "), out.examples
    assert out.examples["too_long"] == [f"taco/4 ({len(ROWS[4]['question'])} characters)"]


def test_without_an_evaluation_set_nothing_counts_as_overlap(tmp_path):
    out = prepare(load_problems(write(tmp_path, ROWS)).problems)
    assert out.removed["overlap"] == 0 and len(out.problems) == 3


def test_normalisation_and_images():
    assert normalise("Ｎ  is\tTWICE—n!") == "n is twice n"
    p = Problem(id="x", question="see ![fig](f.png)", test_kind="stdio", tests=[{"input": "", "output": ""}])
    assert has_image(p)
    assert not has_image(
        Problem(
            id="y",
            question="print 'png' files",
            test_kind="stdio",
            tests=[{"input": "", "output": ""}],
            meta={"picture_num": "0"},
        )
    )


def test_bad_options_are_errors():
    for kw in ({"max_question_chars": 0}, {"ngram": 0}, {"min_shared": 0}, {"common": 0}):
        with pytest.raises(ValueError):
            prepare([], **kw)


def test_cli_reports_each_rule(tmp_path, capsys):
    out = tmp_path / "train.jsonl"
    assert data_main(["data", "prepare", write(tmp_path, ROWS), str(out), "--exclude", "humaneval"]) == 0
    text = capsys.readouterr().out
    assert "prepared 2 of 8 rows (taco)" in text and "not converted (no tests, malformed): 1" in text
    for rule, n in (("image", 2), ("too_long", 1), ("duplicate", 1), ("overlap", 1)):
        assert f"removed by {rule}: {n}" in text
    assert [p.id for p in load_problems(str(out)).problems] == ["taco/0", "taco/7"]
    assert (
        data_main(["data", "prepare", write(tmp_path, ROWS), str(out), "--exclude", str(tmp_path / "nope.jsonl")]) == 2
    )
    assert set(RULES) == {"image", "too_long", "duplicate", "overlap"}
