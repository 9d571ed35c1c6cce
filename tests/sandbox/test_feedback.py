"""Failed tests say what the program produced next to what was expected (for critique feedback)."""

from fastcrit.sandbox import Job
from fastcrit.sandbox.compare import stdout_difference


def test_failure_messages_carry_expected_and_actual(pool):
    jobs = [
        Job(
            code="def f(x):\n    return x * 3 + 2\n",
            kind="assert",
            tests=["assert f(2) == 9", "assert f(0) == 2"],
            entry_point="f",
        ),
        Job(code="print(int(input()) + 1)", kind="stdio", tests=[{"input": "2", "output": "4"}]),
        Job(code="def f(x):\n    return [x]\n", kind="call", tests=[{"args": [2], "expected": [3]}], entry_point="f"),
    ]
    a, s, c = pool.run_many(jobs)
    assert a.tests[0].message == "AssertionError: assert f(2) == 9 (returned 8)" and a.passed == 1
    assert s.tests[0].message == "wrong answer: line 1: expected '4', got '3'"
    assert c.tests[0].message == "returned [2], expected [3]"


def test_stdout_difference_names_the_first_differing_line():
    assert stdout_difference("1\n2\n3\n", "1\n5\n3") == "line 2: expected '5', got '2'"
    assert stdout_difference("1\n", "1\n2\n") == "expected 2 lines, got 1"
    assert stdout_difference("1.0000001\nx", "1.0\ny") == "line 2: expected 'y', got 'x'"
