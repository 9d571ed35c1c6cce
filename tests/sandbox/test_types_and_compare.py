import pytest

from fastcrit.sandbox import Job, JobError
from fastcrit.sandbox.compare import stdout_matches, values_equal


@pytest.mark.parametrize("kw, msg", [
    (dict(code=1, kind="assert", tests=[]), "'code' must be a string"),
    (dict(code="", kind="bash", tests=[]), "'kind' must be one of"),
    (dict(code="", kind="assert", tests="assert 1"), "'tests' must be a list"),
    (dict(code="", kind="assert", tests=[1]), "tests[0] must be Python source"),
    (dict(code="", kind="stdio", tests=[{"input": "1"}]), "tests[0] needs 'input' and 'output'"),
    (dict(code="", kind="stdio", tests=[["1", 2]]), "tests[0]: input and output must be strings"),
    (dict(code="", kind="call", tests=[[[1], 2]]), "kind 'call' needs 'entry_point'"),
    (dict(code="", kind="call", tests=[{"args": [1]}], entry_point="f"), "tests[0] needs 'expected'"),
    (dict(code="", kind="assert", tests=[], timeout_s=-1), "'timeout_s' must be in"),
    (dict(code="", kind="assert", tests=[], memory_mb="big"), "'memory_mb' must be a number"),
    (dict(code="", kind="assert", tests=[], entry_point="not an id"), "'entry_point' must be a Python identifier"),
])
def test_bad_jobs_name_the_field(kw, msg):
    with pytest.raises(JobError) as e:
        Job(**kw)
    assert msg in str(e.value)


def test_from_dict_rejects_unknown_and_missing_fields():
    with pytest.raises(JobError, match="unknown job field"):
        Job.from_dict({"code": "", "kind": "assert", "tests": [], "tset": 1})
    with pytest.raises(JobError, match="missing field 'tests'"):
        Job.from_dict({"code": "", "kind": "assert"})


def test_tests_are_normalised():
    j = Job(code="", kind="stdio", tests=[["1\n", "2\n"]])
    assert j.tests == [{"input": "1\n", "output": "2\n"}]
    j = Job(code="", kind="call", tests=[[[1, 2], 3]], entry_point="f")
    assert j.tests == [{"args": [1, 2], "kwargs": {}, "expected": 3}]


@pytest.mark.parametrize("actual, expected, ok", [
    ("1 2\n3\n", "1 2\n3", True),
    ("1 2   \n3\n\n\n", "1 2\n3\n", True),  # trailing whitespace and blank lines
    ("0.3333334\n", "0.333333", True),  # relative 1e-5 passes (3e-7 relative off)
    ("0.3334\n", "0.3333", False),  # 3e-4 relative off
    ("1 2\n", "1  2\n", True),  # token-wise when the line differs only by spacing
    ("12\n", "1 2\n", False),
    ("yes\n", "YES\n", False),
    ("1\n2\n", "1\n", False),
    ("nan\n", "nan\n", True),  # identical text
    ("inf\n", "1e308\n", False),
])
def test_stdout_matches(actual, expected, ok):
    assert stdout_matches(actual, expected) is ok


@pytest.mark.parametrize("actual, expected, ok", [
    (1, 1, True), (True, 1, False), (1, True, False), (1.0, 1, False), (1.000001, 1.0, True), (1.1, 1.0, False),
    ([1, [2, 3]], (1, (2, 3)), True), ({"a": 1}, {"a": 1}, True), ({"a": 1}, {"a": 1, "b": 2}, False),
    ("1", 1, False), (None, None, True), (None, 0, False), ([1, 2], [1, 2, 3], False),
])
def test_values_equal_is_typed(actual, expected, ok):
    assert values_equal(actual, expected) is ok


# ---------------------------------------------------------------------------------------------
# The comparison rule: exact where the expected value is an integer or a string, a relative
# tolerance of 1e-5 only where it is a float, never inf/nan for a finite expectation.

BIG = 10 ** 400  # beyond any float


@pytest.mark.parametrize("actual, expected, ok", [
    ("123457\n", "123456\n", False),  # an integer off by one in the sixth digit (relative 8e-6)
    ("123456\n", "123456\n", True),
    ("3.0\n", "3\n", False),  # a float where the integer 3 is expected: we follow the expected token
    ("03\n", "3\n", False),
    ("+3\n", "3\n", False),
    (f"{BIG + 1}\n", f"{BIG}\n", False),  # both read as inf by float()
    ("1 2 123457\n", "1 2 123456\n", False),
    ("0.3333333333\n", "0.333333\n", True),  # an honest float printed with more digits
    ("2\n", "2.0\n", True),  # the value 2 where a float is expected
    ("2.0000199\n", "2.\n", True),  # '2.' is a float token
    ("0.0010000099\n", "1e-3\n", True),  # so is '1e-3'
    ("0.00101\n", "1e-3\n", False),
    ("-0.0\n", "0.0\n", True),
    ("1e-300\n", "0.0\n", False),  # no absolute floor: an expected 0 needs 0
    ("inf\n", "1e308\n", False),
    ("1e309\n", "1e308\n", False),  # 1e309 is inf as a float
    ("nan\n", "0.5\n", False),
    ("inf\n", "inf\n", True),  # an expected inf/nan token: the same text only
    ("infinity\n", "inf\n", False),
    ("1e400\n", "inf\n", False),
    ("nan\n", "nan\n", True),
    ("NaN\n", "nan\n", False),
    ("1_000.5\n", "1000.5\n", False),  # only plain ASCII decimal numbers are read as numbers
    ("\u0661\u0662.\u0665\n", "12.5\n", False),  # Arabic-Indic digits
    ("0x10\n", "16.0\n", False),
    (" 1.5\n", "1.5\n", True),  # spacing between tokens does not matter
], ids=lambda v: repr(v)[:24])
def test_stdout_tokens_follow_the_expected_token(actual, expected, ok):
    assert stdout_matches(actual, expected) is ok


@pytest.mark.parametrize("actual, expected, ok", [
    (8.0, 8, False),  # n*n/2 where an int is expected
    (8, 8, True),
    (True, 1, False), (1, True, False), (True, True, True), (0, False, False),
    (1, 1.0, True),  # an int where a float is expected is compared as a number
    (True, 1.0, False),
    (1.000001, 1.0, True), (1.00002, 1.0, False),
    (1e308, BIG, False), (float("inf"), BIG, False), (float("nan"), BIG, False), (BIG, BIG, True),
    (BIG + 1, BIG, False), (BIG, 1.5, False), (10 ** 309, 1e308, False), (BIG, float("inf"), False),
    (float("inf"), 1e308, False), (float("nan"), 1.0, False), (float("-inf"), float("inf"), False),
    (float("inf"), float("inf"), True), (float("nan"), float("nan"), True), (1e308, float("inf"), False),
    (-0.0, 0.0, True), (1e-300, 0.0, False),
    ("8", 8, False), (None, 0, False), ([8.0], [8], False), ({"a": 8.0}, {"a": 8}, False),
    ([1, [2, 3]], (1, (2, 3)), True),
], ids=lambda v: repr(v)[:24])
def test_values_follow_the_expected_type(actual, expected, ok):
    assert values_equal(actual, expected) is ok


def _nested(depth, leaf):
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


def test_values_equal_on_deeply_nested_values_does_not_raise():
    assert values_equal(_nested(20_000, 1), _nested(20_000, 1)) is True
    assert values_equal(_nested(20_000, 1), _nested(20_000, 2)) is False


@pytest.mark.parametrize("test, msg", [
    ({"args": [1], "expected": {1, 2}}, "tests[0].expected"),  # a set is not JSON data
    ({"args": [1], "expected": {1: "a"}}, "tests[0].expected"),  # keys must be strings
    ({"args": [10 ** 5000], "expected": 1}, "tests[0].args"),  # cannot be sent as JSON
    ({"args": [1], "kwargs": {"x": object()}, "expected": 1}, "tests[0].kwargs"),
    ({"args": [_nested(5000, 1)], "expected": 1}, "tests[0].args"),
    ({"args": [1], "expected": float}, "tests[0].expected"),
])
def test_call_tests_must_be_json_data(test, msg):
    with pytest.raises(JobError) as e:
        Job(code="", kind="call", tests=[test], entry_point="f")
    assert msg in str(e.value)


# ---------------------------------------------------------------------------------------------
# Through the pool


def _call(code, expected, args=(), **kw):
    return Job(code=code, kind="call", tests=[{"args": list(args), "expected": expected}], entry_point="f", **kw)


def test_pool_verdicts_follow_the_rule(pool):
    rs = pool.run_many([
        _call("def f(n):\n    return n * n / 2\n", 8, [4]),
        _call("def f(n):\n    return n * n // 2\n", 8, [4]),
        _call("def f():\n    return 1 / 3\n", 0.333333),
        _call("def f():\n    return 1\n", True),
        Job(code="print(123457)", kind="stdio", tests=[["", "123456\n"]]),
        Job(code="print(1 / 3)", kind="stdio", tests=[["", "0.333333\n"]]),
        Job(code="print(3.0)", kind="stdio", tests=[["", "3\n"]]),
        Job(code="print(10 ** 400 + 1)", kind="stdio", tests=[["", f"{BIG}\n"]]),
    ])
    assert [r.status for r in rs] == ["failed", "passed", "passed", "failed", "failed", "passed", "failed", "failed"]
    assert rs[0].tests[0].message == "returned 8.0, expected 8"
    assert rs[4].tests[0].message == "wrong answer: line 1: expected '123456', got '123457'"
