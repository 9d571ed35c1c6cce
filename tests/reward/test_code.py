"""The `code` reward manager over the real sandbox pool (jailed where the machine allows it).

Every score below is checked against a value known by construction: a program's pass rate is the
share of tests whose inputs fall where its (deliberately partial) logic is right.
"""

import ast
import os
import warnings

import pytest

from fastcrit.data.problems import Problem
from fastcrit.reward import RewardItem, get_reward_manager, known_reward_managers
from fastcrit.reward.code import defines_entry_point, extract_program, program_for
from fastcrit.sandbox import IsolationUnavailable, SandboxConfig, probe

_PROBE = probe()
JAIL_OK = _PROBE.ok
ISOLATION = "jail" if JAIL_OK else "none"
needs_jail = pytest.mark.skipif(
    not JAIL_OK, reason=f"hostile programs need the jail, unavailable here: {_PROBE.describe()}"
)

# -- problems, one per test kind ---------------------------------------------------------------

ADD = Problem(
    id="add",
    question="Add two numbers.",
    test_kind="assert",
    entry_point="add",
    tests=["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15", "assert add(2, 2) == 4"],
)
ADD_A = [1, -1, 10, 2]  # the first argument of each test
# Tests with a helper def and a comprehension (the judge runs any test source).
HELPERS = Problem(
    id="helpers",
    question="Add two numbers.",
    test_kind="assert",
    entry_point="add",
    tests=[
        "import math\nassert math.isclose(add(0.5, 0.25), 0.75)",
        "def close(x, y):\n    return abs(x - y) < 1e-9\nassert close(add(1.5, 1.5), 3.0)",
        "assert all([add(i, i) == 2 * i for i in range(1, 5)])",
    ],
)
DOUBLE = Problem(
    id="double",
    question="Print twice the number.",
    test_kind="stdio",
    tests=[
        {"input": "1\n", "output": "2\n"},
        {"input": "5\n", "output": "10\n"},
        {"input": "-3\n", "output": "-6\n"},
        {"input": "0\n", "output": "0\n"},
    ],
)
DOUBLE_N = [1, 5, -3, 0]
SQUARE = Problem(
    id="square",
    question="Square x.",
    test_kind="call",
    entry_point="square",
    starter_code="class Solution:\n    def square(self, x: int) -> int:\n",
    tests=[
        {"args": [2], "expected": 4},
        {"args": [3], "expected": 9},
        {"args": [-1], "expected": 1},
        {"args": [0], "expected": 0},
    ],
)
SQUARE_X = [2, 3, -1, 0]
INC = Problem(
    id="inc",
    question="Increment.",
    test_kind="assert",
    entry_point="inc",
    starter_code='def inc(x):\n    """Return x + 1."""\n',
    tests=["def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n\ncheck(inc)"],
)


def add_prog(c):  # right only where a < c
    return f"def add(a, b):\n    return a + b if a < {c} else -999\n"


def double_prog(c):  # right only where n < c
    return f"n = int(input())\nprint(2 * n if n < {c} else 7)\n"


def square_prog(c):  # right only where x < c
    return f"class Solution:\n    def square(self, x):\n        return x * x if x < {c} else -1\n"


def rate(values, c):
    return sum(v < c for v in values) / len(values)


def item(response, problem):
    return RewardItem(prompt="q", response=response, answer="", problem=problem)


def fenced(code):
    return f"Here is my solution.\n```python\n{code}```\nIt adds."


def make(**kw):
    score = kw.pop("score", "pass_rate")
    cache_path = kw.pop("cache_path", None)
    cfg = SandboxConfig(**{"workers": 2, "isolation": ISOLATION, "timeout_s": 3.0, "memory_mb": 256, **kw})
    return get_reward_manager("code", sandbox=cfg, score=score, cache_path=cache_path)


@pytest.fixture(scope="module")
def reward():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # isolation "none" warns where there is no jail
        with make() as r:
            yield r


# -- extraction (no sandbox) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, program, rule",
    [
        ("Sure:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1\n", "fenced"),
        ("```py\nx = 1\n```", "x = 1\n", "fenced"),
        ("```\nx = 2\n```\n", "x = 2\n", "fenced"),
        ("```Python3 title=sol\nx = 3\n```", "x = 3\n", "fenced"),
        # several blocks: the last one, blocks in other languages passed over
        ("```python\nx = 1\n```\nbetter:\n```python\nx = 2\n```\n```text\n2\n```", "x = 2\n", "fenced"),
        # an opened, unterminated last fence (a truncated generation): the text after it
        (
            "```python\nx = 1\n```\nagain:\n```python\ndef f():\n    return 2",
            "def f():\n    return 2",
            "fenced_unclosed",
        ),
        # an indented fence loses its own indentation only
        ("1. code:\n   ```python\n   def f():\n       return 1\n   ```", "def f():\n    return 1\n", "fenced"),
        # a longer fence may hold a shorter one
        ("````python\ns = '''\n```\n'''\n````", "s = '''\n```\n'''\n", "fenced"),
        ("def f():\n    return 1\n", "def f():\n    return 1\n", "raw"),
        ("use ```print``` here\nx = 1", "use ```print``` here\nx = 1", "raw"),  # inline, not a fence
        ("```cpp\nint main() {}\n```", "```cpp\nint main() {}\n```", "raw"),
        ("    return x + 1", "    return x + 1", "raw"),  # a body keeps its indentation
        ("", "", "empty"),
        (" \n\t\n", "", "empty"),
    ],
)
def test_extract_program(text, program, rule):
    assert extract_program(text) == (program, rule)


@pytest.mark.parametrize(
    "program, defined",
    [
        ("def add(a, b):\n    return a + b\n", True),
        ("async def add(a, b):\n    return a + b\n", True),
        ("class Solution:\n    def add(self, a, b):\n        return a + b\n", True),
        ("class Other:\n    def add(self, a, b):\n        return a + b\n", False),
        ("def outer():\n    def add(a, b):\n        return a + b\n", False),  # not top-level
        ("add = lambda a, b: a + b\n", False),
        ("    return a + b\n", False),  # a body alone does not parse
        ("def add(a, b:\n", False),
    ],
)
def test_defines_entry_point(program, defined):
    assert defines_entry_point(program, "add") is defined


def test_starter_prepended_only_when_needed():
    assert program_for("    return x + 1\n", INC) == (INC.starter_code + "    return x + 1\n", "raw+starter")
    assert program_for(fenced("    return x + 1\n"), INC)[1] == "fenced+starter"
    full = "def inc(x):\n    return x + 1\n"
    assert program_for(full, INC) == (full, "raw")
    assert program_for(full, ADD) == (full, "raw")  # no starter code
    assert program_for("", INC) == ("", "empty")


def test_manager_by_name_and_bad_arguments():
    assert "code" in known_reward_managers()
    with pytest.raises(ValueError, match="reward.score"):
        get_reward_manager("code", score="mean")
    with pytest.raises(ValueError, match=r"sandbox.timeout_s must be a number in \[0.01, 3600\]"):
        get_reward_manager("code", sandbox=SandboxConfig(timeout_s=0.001))
    with pytest.raises(TypeError, match="SandboxConfig"):
        get_reward_manager("code", sandbox={"workers": 2})


def test_reaches_the_sandbox_through_its_package_only():
    import fastcrit.reward.code as mod

    tree = ast.parse(open(mod.__file__).read())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert "fastcrit.sandbox" in names
    assert not [m for m in names if m.startswith("fastcrit.sandbox.")], names


# -- scores from the pool ----------------------------------------------------------------------


def test_all_pass_and_partial_in_every_kind(reward):
    items = [
        item(fenced(add_prog(100)), ADD),
        item(add_prog(2), ADD),
        item(fenced(double_prog(100)), DOUBLE),
        item(double_prog(2), DOUBLE),
        item(fenced(square_prog(100)), SQUARE),
        item(square_prog(1), SQUARE),
        item("    return x + 1\n", INC),
        item("```python\n    return x\n```", INC),
        item("        return x * x\n", SQUARE),
    ]  # a method body, after the stub
    out = reward(items)
    assert [r.score for r in out] == [
        1.0,
        rate(ADD_A, 2),
        1.0,
        rate(DOUBLE_N, 2),
        1.0,
        rate(SQUARE_X, 1),
        1.0,
        0.0,
        1.0,
    ]
    assert out[1].info["statuses"] == ["passed", "passed", "failed", "failed"]
    assert out[3].info["statuses"] == ["passed", "failed", "passed", "passed"]
    assert out[5].info == {
        **out[5].info,
        "passed": 2,
        "total": 4,
        "pass_rate": 0.5,
        "status": "failed",
        "judged_in": "pool",
        "message": "",
        "rule": "raw",
    }
    assert out[6].info["rule"] == "raw+starter" and out[7].info["rule"] == "fenced+starter"
    assert out[8].info["rule"] == "raw+starter"
    for r in out:
        assert set(r.info) >= {
            "rule",
            "passed",
            "total",
            "pass_rate",
            "status",
            "statuses",
            "judged_in",
            "cached",
            "elapsed_s",
            "message",
        }
        assert "reason" not in r.info


def test_all_pass_mode():
    with make(score="all_pass") as r:
        out = r([item(add_prog(100), ADD), item(add_prog(2), ADD), item(double_prog(0), DOUBLE)])
    assert [x.score for x in out] == [1.0, 0.0, 0.0]
    assert out[1].info["pass_rate"] == 0.5 and out[2].info["pass_rate"] == 0.25


def test_sandbox_errors_score_zero_with_statuses(reward):
    out = reward(
        [
            item("def add(a, b)\n    return a + b\n", ADD),  # syntax error
            item("def add(a, b):\n    raise ValueError('no')\n", ADD),
            item("raise RuntimeError('at import')\n", DOUBLE),
            item("class Solution:\n    def square(self, x):\n        return 1 // (x - 3) * 0 + x * x\n", SQUARE),
        ]
    )
    assert [r.score for r in out] == [0.0, 0.0, 0.0, 0.75]
    assert out[0].info["statuses"] == ["error"] * 4 and out[0].info["status"] == "error"
    assert out[1].info["statuses"] == ["error"] * 4
    assert out[2].info["statuses"] == ["error"] * 4
    assert out[3].info["statuses"] == ["passed", "error", "passed", "passed"]


def test_timeout():
    loops_on_3 = (
        "class Solution:\n    def square(self, x):\n        while x == 3:\n            pass\n        return x * x\n"
    )
    with make(timeout_s=1.0) as r:
        [res] = r([item(loops_on_3, SQUARE)])
    assert res.score == 0.75 and res.info["statuses"] == ["passed", "timeout", "passed", "passed"]
    assert res.info["status"] == "timeout"


def test_items_that_cannot_run_score_zero_with_a_reason(reward):
    broken = Problem(id="broken", question="q", test_kind="assert", tests=["assert True"])
    broken.tests = [123]  # corrupted after validation: the job cannot be built
    reward.stats()
    out = reward(
        [
            item(add_prog(100), None),
            item(add_prog(100), {"tests": []}),
            item("", ADD),
            item("```python\n```", ADD),
            item(add_prog(100), broken),
            item(add_prog(100), ADD),
        ]
    )
    reasons = [r.info.get("reason", "") for r in out]
    assert reasons[0].startswith("no problem") and reasons[1].startswith("bad problem: expected")
    assert reasons[2] == "empty response" and reasons[3].startswith("no program")
    assert reasons[4].startswith("bad job: broken: tests[0]") and reasons[5] == ""
    assert [r.score for r in out] == [0.0] * 5 + [1.0]
    assert all(r.info["status"] == "not_run" and r.info["statuses"] == [] for r in out[:5])
    assert out[2].info["total"] == 4  # the problem's tests, none run
    s = reward.stats()
    assert s["items"] == 6 and s["skipped"] == 5 and s["executions"] + s["cache_hits"] == 1
    assert s["skip_reasons"] == {"no problem": 1, "bad problem": 1, "empty response": 1, "no program": 1, "bad job": 1}


def test_remote_backend_failure_is_a_job_level_message():
    cfg = SandboxConfig(backend="remote", remote_url="http://127.0.0.1:9", remote_retries=0, timeout_s=2.0)
    with get_reward_manager("code", sandbox=cfg) as r:
        out = r([item(add_prog(100), ADD), item(double_prog(100), DOUBLE)])
        s = r.stats()
    for res in out:
        assert res.score == 0.0 and res.info["judged_in"] == "remote" and not res.info["cached"]
        assert res.info["message"].startswith("remote sandbox:") and set(res.info["statuses"]) == {"error"}
    assert s["sandbox_errors"] == 2 and s["executions"] == 2


@pytest.mark.skipif(JAIL_OK, reason="the jail works on this machine; this checks the refusal where it does not")
def test_isolation_unavailable_is_raised_at_the_first_call():
    r = get_reward_manager("code", sandbox=SandboxConfig(workers=1, isolation="jail"))
    with pytest.raises(IsolationUnavailable, match="ISOLATION UNAVAILABLE"):
        r([item(add_prog(100), ADD)])
    r.close()


# -- concurrency -------------------------------------------------------------------------------


def _fifty():
    items, rates = [], []
    for c in range(-2, 14):
        items += [item(add_prog(c), ADD), item(double_prog(c), DOUBLE), item(square_prog(c), SQUARE)]
        rates += [rate(ADD_A, c), rate(DOUBLE_N, c), rate(SQUARE_X, c)]
    items += [item("def add(a, b)\n", ADD), item("def add(a, b):\n    return a * b\n", ADD)]
    return items, rates + [0.0, 0.25]


def test_batch_equals_one_at_a_time():
    items, rates = _fifty()
    assert len(items) == 50
    with make() as r:
        one = [r([it])[0] for it in items]
    with make() as r:
        batch = r(items)
        s = r.stats()
    assert [x.score for x in batch] == rates
    assert [(x.score, x.info["statuses"]) for x in batch] == [(x.score, x.info["statuses"]) for x in one]
    assert s["executions"] == 50 and s["cache_hits"] == 0 and s["batches"] == 1


def test_submit_returns_before_the_executions_finish(reward):
    slow = "import time\ndef inc(x):\n    time.sleep(0.5)\n    return x + 1\n"
    fut = reward.submit([item(slow, INC), item(add_prog(3), ADD)])
    assert not fut.done()
    out = fut.result(timeout=60)
    assert [r.score for r in out] == [1.0, 0.75]


# -- cache -------------------------------------------------------------------------------------


def test_cache_hits_are_marked_and_counted(reward):
    reward.stats()
    prog = "def add(a, b):\n    total = a + b\n    return total if a < 5 else 0\n"
    first = reward([item(prog, ADD)])[0]
    second = reward([item(fenced(prog), ADD)])[0]  # the same program, in another response
    assert not first.info["cached"] and second.info["cached"]
    assert first.score == second.score == 0.75 and first.info["statuses"] == second.info["statuses"]
    s = reward.stats()
    assert (s["executions"], s["cache_hits"], s["hit_rate"], s["batches"], s["items"]) == (1, 1, 0.5, 2, 2)
    assert s["last_batch_wall_s"] > 0
    # identical programs in one batch run once
    twins = reward([item(double_prog(4.5), DOUBLE), item(double_prog(4.5), DOUBLE)])
    assert [t.score for t in twins] == [0.75, 0.75] and sorted(t.info["cached"] for t in twins) == [False, True]
    assert reward.stats()["executions"] == 1
    # the cache keys the exact program: other local names and comments make another program
    renamed = "def add(a, b):  # other names\n    s = a + b\n\n    return s if a < 5 else 0\n"
    assert not reward([item(renamed, ADD)])[0].info["cached"] and reward.stats()["executions"] == 1


def test_cache_file_choice_and_clean_up(tmp_path):
    with make() as r:
        r([item(add_prog(100), ADD)])
        private = r.cache_file
        assert os.path.exists(private)
    assert r.cache_file is None and not os.path.exists(os.path.dirname(private))
    for _ in range(2):  # the cache_path argument persists across managers
        with make(cache_path=str(tmp_path / "c.sqlite")) as r:
            res = r([item(add_prog(100), ADD)])[0]
            assert r.cache_file == str(tmp_path / "c.sqlite")
    assert res.info["cached"]
    cfg_path = str(tmp_path / "cfg.sqlite")
    with get_reward_manager(
        "code",
        sandbox=SandboxConfig(workers=1, isolation=ISOLATION, cache_path=cfg_path),
        cache_path=str(tmp_path / "arg.sqlite"),
    ) as r:
        r([item(add_prog(100), ADD)])
        assert r.cache_file == cfg_path


# -- hostile revisions: none scores above its real pass rate ------------------------------------

CORE_ADD = add_prog(2)  # real pass rate 0.5
CORE_ZERO = "def add(a, b):\n    return 0\n"  # real pass rate 0 on HELPERS
CORE_NONE = "def add(a, b):\n    return None\n"  # real pass rate 0 on ADD and HELPERS
CORE_DOUBLE = double_prog(2)  # 0.75
CORE_SQUARE = square_prog(1)  # 0.5
FLOOD_OUT = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
FLOOD_ERR = "import os\nwhile True:\n    os.write(2, b'y' * 65536)\n"
FORGE = (
    "print('passed')\nprint('All tests passed')\nimport sys, os\nsys.stderr.write('OK\\n')\n"
    'for fd in range(3, 64):\n    try:\n        os.write(fd, b\'{"k":"test","i":0,"s":"passed","v":4}\\t00\\n\')\n'
    "    except OSError:\n        pass\n"
)
RIGGED = (
    "class E:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
    "    def __lt__(self, o): return True\n    __hash__ = None\n"
)
BUILTINS = (
    "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.all = lambda *a: True\n"
    "builtins.isinstance = lambda *a: True\n"
)
DUNDER = (
    "b = __builtins__ if isinstance(__builtins__, dict) else __builtins__.__dict__\n"
    "b['all'] = lambda *a: True\nb['abs'] = lambda x: 0\nb['AssertionError'] = type('X', (Exception,), {})\n"
)

# name: (problem, hostile program, its honest core, the core's real pass rate)
HOSTILE = {
    "sys_exit_at_import": (ADD, "import sys\n" + CORE_ADD + "sys.exit(0)\n", CORE_ADD, 0.5),
    "os_exit_at_import": (ADD, "import os\n" + CORE_ADD + "os._exit(0)\n", CORE_ADD, 0.5),
    "sys_exit_in_function": (
        ADD,
        "import sys\ndef add(a, b):\n    if a >= 2:\n        sys.exit(0)\n    return a + b\n",
        CORE_ADD,
        0.5,
    ),
    "os_exit_in_function": (
        ADD,
        "import os\ndef add(a, b):\n    if a >= 2:\n        os._exit(0)\n    return a + b\n",
        CORE_ADD,
        0.5,
    ),
    "os_exit_in_function_helpers": (HELPERS, "import os\ndef add(a, b):\n    os._exit(0)\n", CORE_ZERO, 0.0),
    "redefine_assertion_error": (
        ADD,
        "import builtins\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})\n" + CORE_ADD,
        CORE_ADD,
        0.5,
    ),
    "redefine_assertion_error_helpers": (
        HELPERS,
        "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n" + CORE_ZERO,
        CORE_ZERO,
        0.0,
    ),
    "replace_builtins": (HELPERS, BUILTINS + CORE_ZERO, CORE_ZERO, 0.0),
    "replace_dunder_builtins": (HELPERS, DUNDER + CORE_ZERO, CORE_ZERO, 0.0),
    "patch_test_helpers": (
        HELPERS,
        "import math, operator\nmath.isclose = lambda *a, **k: True\n"
        "operator.eq = lambda a, b: True\ndef close(x, y):\n    return True\n"
        "def check(candidate):\n    return None\n" + CORE_ZERO,
        CORE_ZERO,
        0.0,
    ),
    "rigged_eq": (ADD, RIGGED + "def add(a, b):\n    return E()\n", CORE_NONE, 0.0),
    "rigged_eq_helpers": (HELPERS, RIGGED + "def add(a, b):\n    return E()\n", CORE_NONE, 0.0),
    # an int subclass crosses to the judge as the int it holds: it scores what returning 0 scores
    "rigged_int_eq": (
        ADD,
        "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return I(0)\n",
        "def add(a, b):\n    return 0\n",
        0.25,
    ),
    "flood_stdout": (ADD, CORE_ADD + FLOOD_OUT, CORE_ADD, 0.5),
    "flood_stderr_in_function": (
        ADD,
        "import os\ndef add(a, b):\n    for _ in range(1 << 15):\n"
        "        os.write(2, b'y' * 65536)\n    return a + b\n",
        CORE_ADD,
        0.5,
    ),
    "fake_markers": (ADD, CORE_ADD + FORGE, CORE_ADD, 0.5),
    "fake_markers_helpers": (HELPERS, CORE_ZERO + FORGE, CORE_ZERO, 0.0),
    # stdio: the pool compares the output
    "stdio_os_exit": (DOUBLE, CORE_DOUBLE + "import os\nos._exit(0)\n", CORE_DOUBLE, 0.75),
    "stdio_sys_exit": (DOUBLE, CORE_DOUBLE + "import sys\nsys.exit(0)\n", CORE_DOUBLE, 0.75),
    "stdio_fake_markers": (DOUBLE, FORGE + CORE_DOUBLE, CORE_DOUBLE, 0.75),
    "stdio_flood": (DOUBLE, CORE_DOUBLE + FLOOD_OUT, CORE_DOUBLE, 0.75),
    "stdio_patch_builtins": (
        DOUBLE,
        BUILTINS + "import builtins\nbuiltins.int = lambda s: 1\n" + CORE_DOUBLE,
        CORE_DOUBLE,
        0.75,
    ),
    # call: the return value is serialised by trusted code and compared in the pool
    "call_rigged_eq": (
        SQUARE,
        RIGGED + "class Solution:\n    def square(self, x):\n        return E()\n",
        CORE_SQUARE,
        0.5,
    ),
    "call_str_subclass": (
        SQUARE,
        "class S(str):\n    def __eq__(self, o): return True\n"
        "class Solution:\n    def square(self, x):\n        return S('4')\n",
        CORE_SQUARE,
        0.5,
    ),
    "call_patch_json": (
        SQUARE,
        "import json\njson.dumps = lambda *a, **k: '4'\njson.JSONEncoder.encode = lambda *a: '4'\n" + CORE_SQUARE,
        CORE_SQUARE,
        0.5,
    ),
    "call_sys_exit_in_method": (
        SQUARE,
        "import sys\nclass Solution:\n    def square(self, x):\n"
        "        if x > 0:\n            sys.exit(0)\n        return x * x\n",
        CORE_SQUARE,
        0.5,
    ),
    "call_os_exit_at_import": (SQUARE, CORE_SQUARE + "import os\nos._exit(0)\n", CORE_SQUARE, 0.5),
    "call_fake_markers": (SQUARE, CORE_SQUARE + FORGE, CORE_SQUARE, 0.5),
    "call_flood_stderr": (SQUARE, CORE_SQUARE + FLOOD_ERR, CORE_SQUARE, 0.5),
}


@pytest.fixture(scope="module")
def hostile(reward):
    if not JAIL_OK:
        pytest.skip(f"hostile programs need the jail, unavailable here: {_PROBE.describe()}")
    names = sorted(HOSTILE)
    items = [item(fenced(HOSTILE[n][1]), HOSTILE[n][0]) for n in names]
    items += [item(HOSTILE[n][2], HOSTILE[n][0]) for n in names]
    out = reward(items)
    return {n: (out[i], out[len(names) + i]) for i, n in enumerate(names)}


def test_assert_tests_are_judged_by_the_judge(reward):
    [r] = reward([item(CORE_ZERO, HELPERS)])
    assert r.info["judged_in"] == "judge"  # assert tests run in the judge process, outside the program


@needs_jail
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_never_above_its_real_pass_rate(hostile, name):
    res, core = hostile[name]
    real = HOSTILE[name][3]
    assert core.score == real, (name, core.info)  # the honest core scores what we say it does
    assert res.info["rule"] == "fenced"
    assert res.score <= real, (name, res.info)
    assert res.info["status"] != "passed" and res.info["passed"] <= round(real * res.info["total"])


@needs_jail
def test_hostile_statuses_say_why(hostile):
    assert set(hostile["flood_stdout"][0].info["statuses"]) == {"output_limit"}
    assert set(hostile["os_exit_at_import"][0].info["statuses"]) == {"error"}
    assert set(hostile["rigged_eq"][0].info["statuses"]) == {"error"}
    assert hostile["rigged_eq"][0].info["judged_in"] == "judge"
    # the judge refuses to compare the rigged object; no test passed
    assert set(hostile["rigged_eq_helpers"][0].info["statuses"]) <= {"error", "failed"}
