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
    (1, 1, True), (True, 1, False), (1, True, False), (1.0, 1, True), (1.000001, 1.0, True), (1.1, 1.0, False),
    ([1, [2, 3]], (1, (2, 3)), True), ({"a": 1}, {"a": 1}, True), ({"a": 1}, {"a": 1, "b": 2}, False),
    ("1", 1, False), (None, None, True), (None, 0, False), ([1, 2], [1, 2, 3], False),
])
def test_values_equal_is_typed(actual, expected, ok):
    assert values_equal(actual, expected) is ok
