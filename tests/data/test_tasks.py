"""Each shipped task declares how its final answer is read from an output (what RARO's critic sees)."""

import pytest

from fastcrit.data.datasets import load_dataset
from fastcrit.data.tasks import ANSWER_FORMATS, TASK_ANSWER_FORMATS, answer_format, final_answer


@pytest.mark.parametrize(
    "fmt,text,want",
    [
        ("line", "e d c b a", "e d c b a"),
        ("line", "Reversed, one by one:\n\n  e d c b a  \n", "e d c b a"),  # the answer line, not the reasoning
        ("line", " \n\t\n", None),  # nothing to show
        ("line", "", None),
        ("boxed", "7 - 3 = 4, so \\boxed{4}", "4"),
        ("boxed", "\\boxed{\\frac{1}{2}} is it", "\\frac{1}{2}"),  # balanced braces
        ("boxed", "first \\boxed{1}, then \\boxed{2}\n", "2"),  # the last box
        ("boxed", "4", "4"),  # a bare answer: its line
        ("boxed", "so \\boxed{}", None),  # an empty box
    ],
)
def test_final_answer_by_format(fmt, text, want):
    assert final_answer(text, fmt) == want


def test_every_shipped_rl_task_declares_a_known_format_that_reads_its_expert_answers():
    assert set(TASK_ANSWER_FORMATS.values()) <= set(ANSWER_FORMATS)
    for task in TASK_ANSWER_FORMATS:
        for ex in load_dataset(task, default_split="train").examples[:50]:
            fmt = answer_format(ex.meta)
            assert fmt == TASK_ANSWER_FORMATS[task]
            assert final_answer(ex.answer, fmt) == ex.answer.strip()  # the references are final answers


def test_a_row_may_name_its_format_and_an_undeclared_row_has_none():
    assert answer_format({"task": "reverse", "answer_format": "boxed"}) == "boxed"
    assert answer_format({"task": "math"}) == "boxed"
    assert answer_format({}) is None and answer_format({"task": "unknown"}) is None
    assert answer_format({"task": ["reverse"]}) is None
