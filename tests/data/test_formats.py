"""Public problem formats -> Problem: hand-written rows in each dataset's published layout, converted,
then run in the real sandbox pool (reference solutions pass, wrong programs fail)."""

import base64
import json
import os
import pickle
import warnings
import zlib

import pytest

from fastcrit.data.datasets import DatasetError
from fastcrit.data.formats import APPS_PRELUDE, LCB_PRELUDE, from_apps, from_codecontests, from_livecodebench, from_mbpp
from fastcrit.data.problem_files import detect_format, load_problems
from fastcrit.data.problems import ProblemError
from fastcrit.sandbox import SyncSandboxPool, probe


@pytest.fixture(scope="module")
def pool():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # isolation "none" warns where the jail is missing
        p = SyncSandboxPool(workers=2, isolation="jail" if probe().ok else "none").__enter__()
    yield p
    p.close()


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def check_in_sandbox(pool, problems, wrong):
    """Every reference solution passes every test; the wrong program of each problem fails."""
    jobs, what = [], []
    for p in problems:
        assert p.solutions, p.id
        for s in p.solutions:
            jobs.append(p.job(s, timeout_s=10))
            what.append((p, True))
        jobs.append(p.job(wrong[p.id], timeout_s=10))
        what.append((p, False))
    for (p, good), r in zip(what, pool.run_many(jobs)):
        assert r.total == len(p.tests), p.id
        if good:
            assert r.all_passed, (p.id, r.to_dict())
        else:
            assert not r.all_passed, p.id


# ---------------------------------------------------------------------------------------------
# HumanEval


def test_humaneval_package_164_canonical_solutions_pass(pool):
    ps = load_problems("humaneval")
    assert ps.format == "humaneval" and len(ps) == 164 and not ps.skipped
    assert ps.source.endswith("HumanEval.jsonl.gz")
    p0 = ps.problems[0]
    assert p0.id == "HumanEval/0" and p0.entry_point == "has_close_elements" and p0.test_kind == "assert"
    assert p0.question == p0.starter_code and p0.solutions[0].startswith(p0.starter_code)
    assert p0.tests[0].rstrip().endswith("check(has_close_elements)")
    bare = ps.problems[:20]  # the prompt alone (docstring, no body) returns None: must fail
    jobs = [p.job(p.solutions[0]) for p in ps.problems] + [p.job(p.starter_code, job_id=f"bare/{p.id}") for p in bare]
    res = pool.run_many(jobs)
    assert [r.id for r in res if not r.all_passed] == [f"bare/{p.id}" for p in bare]


# ---------------------------------------------------------------------------------------------
# MBPP (original and sanitized) and MBPP+

MBPP_ROWS = [
    {
        "text": "Write a python function to count the vowels in a given string.",
        "code": "def count_vowels(s):\r\n  return sum(1 for c in s.lower() if c in 'aeiou')",
        "task_id": 901,
        "test_setup_code": "",
        "test_list": [
            "assert count_vowels('hello') == 2",
            "assert count_vowels('AEIOU') == 5",
            "assert count_vowels('xyz') == 0",
        ],
        "challenge_test_list": [],
    },
    {
        "text": "Write a function to find the area of a circle.",
        "code": "import math\r\ndef circle_area(r):\r\n  return math.pi * r * r",
        "task_id": 902,
        "test_setup_code": "import math",
        "test_list": [
            "assert math.isclose(circle_area(1), 3.141592653589793)",
            "assert math.isclose(circle_area(2), 12.566370614359172)",
            "assert circle_area(0) == 0",
        ],
        "challenge_test_list": ["assert math.isclose(circle_area(0.5), 0.7853981633974483)"],
    },
]
MBPP_SANITIZED = {
    "source_file": "Benchmark Questions Verification V2.ipynb",
    "task_id": 903,
    "prompt": "Write a function to find the shared elements from the given two tuples.",
    "code": "def shared_elements(a, b):\n    return tuple(set(a) & set(b))",
    "test_imports": [],
    "test_list": [
        "assert set(shared_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))",
        "assert set(shared_elements((1, 2, 3, 4), (5, 4, 3, 7))) == set((3, 4))",
        "assert set(shared_elements((11, 12), (13, 14))) == set()",
    ],
}

MBPPPLUS_TEST = """import numpy as np
from math import inf


def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


def assertion(out, exp, atol):
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if out != exp and atol != 0:
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert out == exp, f"out: {out}, exp: {exp}"


inputs = [[(3, 4, 5, 6), (5, 7, 4, 10)], [(1, 2, 3, 4), (5, 4, 3, 7)], [(), (1,)], [(9, 8, 7), (7, 8, 9)]]
results = [(4, 5), (3, 4), (), (7, 8, 9)]
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion(sorted_shared(*inp), exp, 0)
"""
MBPPPLUS_ROW = {
    "task_id": 904,
    "code": "def sorted_shared(a, b):\n    return tuple(sorted(set(a) & set(b)))\n",
    "prompt": "Write a function to find the shared elements of two tuples, in increasing order.",
    "source_file": "Benchmark Questions Verification V2.ipynb",
    "test_imports": [],
    "test_list": ["assert sorted_shared((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)"],
    "test": MBPPPLUS_TEST,
}


def test_mbpp_layouts_convert_and_run(tmp_path, pool):
    orig = load_problems(write_jsonl(tmp_path / "mbpp.jsonl", MBPP_ROWS))
    assert orig.format == "mbpp" and [p.id for p in orig.problems] == ["mbpp/901", "mbpp/902"]
    vowels, area = orig.problems
    assert vowels.entry_point == "count_vowels" and vowels.tests == MBPP_ROWS[0]["test_list"]
    assert vowels.question == MBPP_ROWS[0]["text"] + "\n" + MBPP_ROWS[0]["test_list"][0]
    assert area.entry_point == "circle_area"  # math.isclose is an attribute call, not a candidate
    assert all(t.startswith("import math\nassert ") for t in area.tests) and len(area.tests) == 3
    with_challenge = from_mbpp(MBPP_ROWS[1], challenge_tests=True)
    assert len(with_challenge.tests) == 4
    shadow = {
        **MBPP_ROWS[0],
        "code": "def filter(xs):\n    return [x for x in xs if x % 2]",
        "test_list": ["assert filter([1, 2, 3]) == [1, 3]", "assert len(filter([2])) == 0"],
    }
    assert from_mbpp(shadow).entry_point == "filter"  # a builtin's name the reference redefines
    with pytest.raises(ProblemError, match="test 1 is not valid Python"):
        from_mbpp({**MBPP_ROWS[0], "test_list": ["assert count_vowels('a') == 1", "assert count_vowels("]})
    # sanitized-mbpp.json is one JSON array; `set` and `sorted` are builtins, not the entry point
    (tmp_path / "sanitized-mbpp.json").write_text(json.dumps([MBPP_SANITIZED]))
    san = load_problems(str(tmp_path / "sanitized-mbpp.json"))
    assert san.format == "mbpp" and san.problems[0].entry_point == "shared_elements"
    plus = load_problems(write_jsonl(tmp_path / "mbppplus.jsonl", [MBPPPLUS_ROW]))
    assert plus.format == "mbppplus"
    pp = plus.problems[0]
    assert pp.id == "mbppplus/904" and pp.entry_point == "sorted_shared" and pp.tests == [MBPPPLUS_TEST]
    wrong = {
        "mbpp/901": "def count_vowels(s):\n    return len(s) // 2\n",
        "mbpp/902": "def circle_area(r):\n    return 3.14 * r * r\n",
        "mbpp/903": "def shared_elements(a, b):\n    return tuple(a)\n",
        "mbppplus/904": "def sorted_shared(a, b):\n    return tuple(set(a) & set(b))\n",
    }  # unsorted
    check_in_sandbox(pool, orig.problems + [with_challenge] + san.problems + plus.problems, wrong)


def test_mbppplus_release_layout_without_outputs_is_refused(tmp_path):
    release = {
        "task_id": "Mbpp/2",
        "prompt": '"""\nWrite a function.\nassert f(1) == 1\n"""\n',
        "entry_point": "f",
        "canonical_solution": "def f(x):\n    return x\n",
        "contract": "",
        "base_input": [[1]],
        "plus_input": [[2]],
        "atol": 0,
    }
    assert detect_format(release) == "mbppplus"
    with pytest.raises(DatasetError, match="no expected outputs"):
        load_problems(write_jsonl(tmp_path / "MbppPlus.jsonl", [release]))


# ---------------------------------------------------------------------------------------------
# APPS and TACO

APPS_STDIO = {
    "problem_id": 4001,
    "question": "Given n integers, print their sum.\n\n-----Input-----\n\nThe first line contains n (1 <= n <= 100)."
    " The second line contains n integers.\n\n-----Output-----\n\nPrint the sum.\n",
    "solutions": json.dumps(
        [
            "n = int(input())\nprint(sum(map(int, input().split())))\n",
            "import sys\ndata = sys.stdin.read().split()\nprint(sum(int(x) for x in data[1:]))\n",
        ]
    ),
    "input_output": json.dumps(
        {"inputs": ["3\n1 2 3\n", "1\n-5\n", "4\n10 20 30 40\n"], "outputs": ["6\n", "-5\n", "100\n"]}
    ),
    "difficulty": "introductory",
    "url": "https://codeforces.com/problemset/problem/0/A",
    "starter_code": "",
}
APPS_CODEWARS = {  # Codewars rows wrap every expected value in a one-element list
    "problem_id": 2401,
    "question": "Write a function `digits_sum` that returns the sum of the digits of a non-negative integer.",
    "solutions": json.dumps(["def digits_sum(n):\n    return sum(int(d) for d in str(n))"]),
    "input_output": json.dumps({"fn_name": "digits_sum", "inputs": [[0], [123], [9999]], "outputs": [[0], [6], [36]]}),
    "difficulty": "introductory",
    "url": "https://www.codewars.com/kata/0",
    "starter_code": "def digits_sum(n):\n\t",
}
APPS_LEETCODE = {  # class Solution, `List` used without an import, list outputs stored unwrapped
    "problem_id": 310,
    "question": "Given an array nums, return the running sum: runningSum[i] = sum(nums[0]...nums[i]).",
    "solutions": json.dumps(
        [
            "class Solution:\n    def runningSum(self, nums: List[int]) -> List[int]:\n"
            "        out = []\n        for x in nums:\n"
            "            out.append(x + (out[-1] if out else 0))\n"
            "        return out\n"
        ]
    ),
    "input_output": json.dumps(
        {"fn_name": "runningSum", "inputs": [[[1, 2, 3, 4]], [[5]], [[3, 1]]], "outputs": [[1, 3, 6, 10], [5], [3, 4]]}
    ),
    "difficulty": "interview",
    "url": "https://leetcode.com/problems/running-sum-of-1d-array/",
    "starter_code": "class Solution:\n    def runningSum(self, nums: List[int]) -> List[int]:\n        ",
}

TACO_EXTRA = {
    "raw_tags": "['Math']",
    "name": None,
    "source": "codechef",
    "tags": "['Mathematics']",
    "skill_types": "[]",
    "Expected Auxiliary Space": None,
    "time_limit": "1 seconds",
    "date": None,
    "picture_num": None,
    "memory_limit": "50000 bytes",
    "Expected Time Complexity": None,
}
TACO_STDIO = {  # inputs and outputs as lists of lines
    "question": "For each of T test cases, read two integers A and B and print A + B.",
    "solutions": json.dumps(["for _ in range(int(input())):\n\ta, b = map(int, input().split())\n\tprint(a + b)"]),
    "starter_code": "",
    "input_output": json.dumps({"inputs": [["2", "1 2", "3 4"], ["1", "-1 1"]], "outputs": [["3", "7"], ["0"]]}),
    "difficulty": "EASY",
    "url": "https://www.codechef.com/problems/XSUM",
    **TACO_EXTRA,
}
TACO_CALL = {  # scalars, some wrapped and some not
    "question": "Return True if n is even.",
    "solutions": json.dumps(["def is_even(n):\n\treturn n % 2 == 0", "is_even = lambda n: not n & 1"]),
    "starter_code": "def is_even(n):\n\t",
    "input_output": json.dumps({"fn_name": "is_even", "inputs": [[2], [7], [0]], "outputs": [[True], False, [True]]}),
    "difficulty": "EASY",
    "url": "https://www.codewars.com/kata/1",
    **TACO_EXTRA,
}
TACO_PAIRS = {  # list answers, every one wrapped
    "question": "Split a string into pairs of two characters, padding the last with '_'.",
    "solutions": json.dumps(
        ["def split_pairs(s):\n    s += '_' * (len(s) % 2)\n    return [s[i:i + 2] for i in range(0, len(s), 2)]"]
    ),
    "starter_code": "def split_pairs(s):\n\t",
    "input_output": json.dumps(
        {
            "fn_name": "split_pairs",
            "inputs": [["abcd"], ["abc"], [""]],
            "outputs": [[["ab", "cd"]], [["ab", "c_"]], [[]]],
        }
    ),
    "difficulty": "EASY",
    "url": "https://www.codewars.com/kata/2",
    **TACO_EXTRA,
}


def test_apps_stdio_and_call_based(tmp_path, pool):
    ps = load_problems(write_jsonl(tmp_path / "apps.jsonl", [APPS_STDIO, APPS_CODEWARS, APPS_LEETCODE]))
    assert ps.format == "apps" and [p.id for p in ps.problems] == ["apps/4001", "apps/2401", "apps/310"]
    stdio, codewars, leet = ps.problems
    assert stdio.test_kind == "stdio" and stdio.tests[2] == {"input": "4\n10 20 30 40\n", "output": "100\n"}
    assert stdio.meta["difficulty"] == "introductory" and len(stdio.solutions) == 2
    assert codewars.test_kind == "call" and codewars.entry_point == "digits_sum"
    assert [t["expected"] for t in codewars.tests] == [0, 6, 36]  # unwrapped
    assert [t["expected"] for t in leet.tests] == [[1, 3, 6, 10], [5], [3, 4]]  # real lists stay
    assert leet.tests[0]["args"] == [[1, 2, 3, 4]] and leet.starter_code.startswith("class Solution:")
    assert all(p.prelude == APPS_PRELUDE and not s.startswith(APPS_PRELUDE) for p in ps.problems for s in p.solutions)
    wrong = {
        "apps/4001": "n = int(input())\nprint(n)\n",
        "apps/2401": "def digits_sum(n):\n    return [sum(int(d) for d in str(n))]\n",  # still wrapped
        "apps/310": "class Solution:\n    def runningSum(self, nums):\n        return nums\n",
    }
    check_in_sandbox(pool, ps.problems, wrong)
    # without the harness's imports, the LeetCode reference's `List` annotation is a NameError
    bare = from_apps(APPS_LEETCODE, prelude=False)
    assert bare.prelude == "" and not bare.solutions[0].startswith("import")
    r = pool.run(bare.job(bare.solutions[0]))
    assert not r.all_passed and "NameError" in r.tests[0].message


def test_taco_rows_without_ids_and_wrapping_quirks(tmp_path, pool):
    ps = load_problems(write_jsonl(tmp_path / "taco.jsonl", [TACO_STDIO, TACO_CALL, TACO_PAIRS]))
    assert ps.format == "taco" and [p.id for p in ps.problems] == ["taco/0", "taco/1", "taco/2"]
    stdio, even, pairs = ps.problems
    assert stdio.tests == [{"input": "2\n1 2\n3 4", "output": "3\n7"}, {"input": "1\n-1 1", "output": "0"}]
    assert stdio.meta["source"] == "codechef" and stdio.meta["time_limit"] == "1 seconds" and "name" not in stdio.meta
    assert [t["expected"] for t in even.tests] == [True, False, True]
    assert [t["expected"] for t in pairs.tests] == [["ab", "cd"], ["ab", "c_"], []]
    wrong = {
        "taco/0": "for _ in range(int(input())):\n    a, b = map(int, input().split())\n    print(a * b)\n",
        "taco/1": "def is_even(n):\n    return int(n % 2 == 0)\n",  # 1 is not True
        "taco/2": "def split_pairs(s):\n    return [s[i:i + 2] for i in range(0, len(s), 2)]\n",
    }  # no padding
    check_in_sandbox(pool, ps.problems, wrong)


# ---------------------------------------------------------------------------------------------
# CodeContests

CC_ROW = {
    "name": "1700_A. Pair Sums",
    "description": "You are given t pairs of integers. For each pair print its sum.\n\nInput\n\nThe first line "
    "contains t (1 <= t <= 100), then t lines with two integers a and b.\n\nOutput\n\nt lines.",
    "public_tests": {"input": ["2\n1 2\n3 4\n"], "output": ["3\n7\n"]},
    "private_tests": {
        "input": ["1\n-5 5\n", "3\n1000000000 1000000000\n0 0\n7 -8\n"],
        "output": ["0\n", "2000000000\n0\n-1\n"],
    },
    "generated_tests": {"input": ["1\n2 2\n"], "output": ["4\n"]},
    "source": 2,
    "difficulty": 7,
    "solutions": {
        "language": [2, 3, 1, 3],
        "solution": [
            '#include <cstdio>\nint main(){int t;long long a,b;scanf("%d",&t);'
            'while(t--){scanf("%lld%lld",&a,&b);printf("%lld\\n",a+b);}}',
            "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a + b)\n",
            "t = input()\nfor _ in range(t):\n    print sum(map(int, raw_input().split()))\n",
            "import sys\nd = sys.stdin.read().split()\n"
            "print('\\n'.join(str(int(d[i]) + int(d[i + 1])) "
            "for i in range(1, len(d), 2)))\n",
        ],
    },
    "incorrect_solutions": {
        "language": [3],
        "solution": ["t = int(input())\nfor _ in range(t):\n    a, b = input().split()\n    print(a + b)\n"],
    },
    "cf_contest_id": 1700,
    "cf_index": "A",
    "cf_points": 500.0,
    "cf_rating": 800,
    "cf_tags": ["implementation"],
    "is_description_translated": False,
    "untranslated_description": "",
    "time_limit": {"seconds": 2, "nanos": 500000000},
    "memory_limit_bytes": 256000000,
    "input_file": "",
    "output_file": "",
}


def test_codecontests_python3_solutions_and_test_sets(tmp_path, pool):
    ps = load_problems(write_jsonl(tmp_path / "cc.jsonl", [CC_ROW]))
    assert ps.format == "codecontests"
    p = ps.problems[0]
    assert p.id == "codecontests/1700_A. Pair Sums" and p.test_kind == "stdio" and len(p.tests) == 4
    assert p.solutions == [CC_ROW["solutions"]["solution"][1], CC_ROW["solutions"]["solution"][3]]  # PYTHON3 only
    assert p.meta["time_limit_s"] == 2.5 and p.meta["source_name"] == "CODEFORCES" and p.meta["cf_rating"] == 800
    public = from_codecontests(CC_ROW, test_sets=("public",))
    assert public.tests == [{"input": "2\n1 2\n3 4\n", "output": "3\n7\n"}]
    check_in_sandbox(pool, [p], {p.id: CC_ROW["incorrect_solutions"]["solution"][0]})  # string concatenation
    with pytest.raises(ValueError, match="test_sets"):
        from_codecontests(CC_ROW, test_sets=("hidden",))
    with pytest.raises(ProblemError, match="input_file"):
        from_codecontests({**CC_ROW, "input_file": "input.txt"})


# ---------------------------------------------------------------------------------------------
# LiveCodeBench


def lcb_compress(cases) -> str:
    """What code_generation_lite stores: base64 of zlib of a pickled JSON string."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB_FUNCTIONAL = {
    "question_title": "Count Pairs Below Target",
    "platform": "leetcode",
    "question_id": "2824",
    "question_content": "Given a 0-indexed integer array nums and an integer target, return the number of pairs "
    "(i, j) with 0 <= i < j < n and nums[i] + nums[j] < target.",
    "contest_id": "biweekly-contest-111",
    "contest_date": "2023-08-19T00:00:00",
    "difficulty": "easy",
    "starter_code": "class Solution:\n    def countPairs(self, nums: List[int], target: int) -> int:\n        ",
    "public_test_cases": json.dumps(
        [
            {"input": "[-1, 1, 2, 3, 1]\n2", "output": "3", "testtype": "functional"},
            {"input": "[-6, 2, 5, -2, -7, -1, 3]\n-2", "output": "10", "testtype": "functional"},
        ]
    ),
    "private_test_cases": lcb_compress(
        [
            {"input": "[1]\n5", "output": "0", "testtype": "functional"},
            {"input": "[0, 0, 0]\n1", "output": "3", "testtype": "functional"},
        ]
    ),
    "metadata": json.dumps({"func_name": "countPairs"}),
}
LCB_STDIN = {
    "question_title": "Add Two",
    "platform": "atcoder",
    "question_id": "abc900_a",
    "question_content": "You are given integers A and B. Print A+B.\n\nInput\n\nA B\n\nOutput\n\nPrint the answer.",
    "contest_id": "abc900",
    "contest_date": "2024-01-06T00:00:00",
    "difficulty": "easy",
    "starter_code": "",
    "public_test_cases": json.dumps([{"input": "3 5\n", "output": "8\n", "testtype": "stdin"}]),
    "private_test_cases": json.dumps([{"input": "100 -100\n", "output": "0\n", "testtype": "stdin"}]),  # plain JSON
    "metadata": "{}",
}


def test_livecodebench_functional_and_stdin(tmp_path, pool):
    ps = load_problems(write_jsonl(tmp_path / "lcb.jsonl", [LCB_FUNCTIONAL, LCB_STDIN]))
    assert ps.format == "livecodebench"
    fn, std = ps.problems
    assert fn.id == "livecodebench/2824" and fn.test_kind == "call" and fn.entry_point == "countPairs"
    assert fn.tests[0] == {"args": [[-1, 1, 2, 3, 1], 2], "kwargs": {}, "expected": 3}
    assert len(fn.tests) == 4 and fn.tests[3] == {"args": [[0, 0, 0], 1], "kwargs": {}, "expected": 3}
    assert fn.meta["platform"] == "leetcode" and fn.prelude == LCB_PRELUDE and not fn.solutions
    assert std.test_kind == "stdio" and std.tests[1] == {"input": "100 -100\n", "output": "0\n"}
    assert len(from_livecodebench(LCB_FUNCTIONAL, test_sets=("public",)).tests) == 2
    # LiveCodeBench ships no references: an answer completing the starter code, run after the
    # harness's imports (which give it `List`), must pass; a wrong one must fail.
    good = (
        fn.starter_code + "n = len(nums)\n        return sum(nums[i] + nums[j] < target "
        "for i in range(n) for j in range(i + 1, n))\n"
    )
    bad = fn.starter_code + "return len(nums)\n"
    add = "a, b = map(int, input().split())\nprint(a + b)\n"
    r_good, r_bad, r_std = pool.run_many([fn.job(good), fn.job(bad), std.job(add)])
    assert r_good.all_passed and r_std.all_passed, (r_good.to_dict(), r_std.to_dict())
    assert r_bad.passed < r_bad.total


def test_livecodebench_refuses_pickled_globals_and_mixed_tests(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    evil = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    mixed = json.dumps(
        [
            {"input": "1\n", "output": "1\n", "testtype": "stdin"},
            {"input": "1", "output": "1", "testtype": "functional"},
        ]
    )
    rows = [
        LCB_STDIN,
        {**LCB_FUNCTIONAL, "question_id": "evil", "private_test_cases": evil},
        {**LCB_FUNCTIONAL, "question_id": "mixed", "public_test_cases": mixed},
        {**LCB_FUNCTIONAL, "question_id": "nofn", "metadata": "{}"},
        {**LCB_FUNCTIONAL, "question_id": "b64", "private_test_cases": "eJz%%%not base64"},
        {
            **LCB_FUNCTIONAL,
            "question_id": "badarg",
            "public_test_cases": json.dumps([{"input": "[1, 2\n3", "output": "1", "testtype": "functional"}]),
        },
    ]
    path = write_jsonl(tmp_path / "lcb.jsonl", rows)
    ps = load_problems(path)
    assert [p.id for p in ps.problems] == ["livecodebench/abc900_a"] and len(ps.skipped) == 5
    assert not marker.exists()
    assert ps.skipped[0].startswith(f"{path}:2: 'private_test_cases': refused: the pickle asks for the global")
    assert ps.skipped[1].startswith(f"{path}:3: mixed test types ['functional', 'stdin']")
    assert ps.skipped[2] == f"{path}:4: 'metadata'.func_name must be a Python identifier, got None"
    assert ps.skipped[3] == f"{path}:5: 'private_test_cases' is neither JSON nor base64"
    assert ps.skipped[4].startswith(f"{path}:6: 'public_test_cases'[0].input: a line is not JSON")
    # a decompression bomb stops at max_private_bytes
    big = {
        **LCB_FUNCTIONAL,
        "private_test_cases": lcb_compress([{"input": "[0]\n1", "output": "0", "testtype": "functional"}] * 5000),
    }
    with pytest.raises(ProblemError, match="more than 1000 bytes"):
        from_livecodebench(big, max_private_bytes=1000)
