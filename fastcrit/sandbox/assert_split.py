"""Judge ``assert`` tests in the pool process where the test allows it.

An ``assert`` test normally runs inside the execution, and a program written against the harness
can reach the harness there (docs/sandbox.md, "Not covered"). Many tests, though, are only data:
``assert candidate(<literal args>) == <literal>``. For those the pool needs nothing from the
execution but the return values. ``split_test`` parses a test (stdlib ``ast`` only, no code is
run) and, when EVERY statement is of a form listed below, turns it into

- calls: the arguments of each entry-point call, in order, typed-encoded
  (``harness.to_typed``: tuples stay tuples, sets sets, dict keys keep their type), sent to the
  worker like a ``call`` job; the execution returns each value typed-encoded by trusted code;
- checks: the assert expressions with each call replaced by a slot, evaluated here, in the pool, on
  the decoded values (built-in types only, built by our decoder: no object of the program, so no
  program ``__eq__``) with a small evaluator that knows literals, the test's constants, a few pure
  built-ins and ``math`` functions, arithmetic on numbers, comparisons and boolean operators.

Accepted forms (anything else returns ``None`` and the caller falls back to the in-process harness):

- top level: docstrings, ``pass``, ``import``/``from ... import`` (not run: see below), ``NAME =
  <literal>`` (``ast.literal_eval``-able, or built from other constants by the evaluator), asserts
  (MBPP/APPS style, calling the entry point by name), ``def check(<param>): ...`` and one call
  ``check(<entry point>)`` after it (HumanEval style);
- inside ``check``: docstrings, ``pass``, constant assignments, asserts (calling the parameter),
  and ``for NAME in range(<constants>): <accepted statements>`` (unrolled, at most 1,000 passes);
- in an assert: the entry point called with arguments the evaluator can compute without it (no
  call nested in another call's arguments, no ``*args``), compared, negated, tested for truth,
  passed to ``abs``/``len``/``sorted``/``set``/``round``/``math.isclose``/..., combined with
  ``and``/``or``; the assert's message is ignored (it only matters once the assert has failed).

Differences from running the test in the process, all on the side of refusing a pass:

- the return value must be of a built-in type (``None``, ``bool``, ``int``, ``float``, ``complex``,
  ``str``, ``bytes``, ``list``, ``tuple``, ``set``, ``frozenset``, ``dict``; ``OrderedDict``,
  ``defaultdict`` and ``Counter`` are read as ``dict``), nested likewise; anything else (a
  generator, a ``deque``, an object of the program's own class) is an ``error``, where the
  in-process harness would compare some of those;
- the test's imports are not run in the execution, so a solution that uses ``math`` without
  importing it, which the in-process run lets through when the test imports ``math``, fails;
- names like ``abs`` mean the built-ins, even where the solution rebinds them in its globals;
- the calls run in order, in one execution, as in the process, but those after a failing assert
  run too (only the pool knows the value is wrong; after a call that does not return at all, the
  worker skips the rest of that test); ``timeout_s`` bounds the whole test (the worker moves the
  deadline on only when a test's last call has returned), so those extra calls count towards it.
"""
from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass

from .harness import from_typed, to_typed

MAX_UNROLL = 1000  # passes of one `for ... in range(...)` loop
MAX_CALLS = 5000  # entry-point calls in one test
MAX_SIZE = 1 << 20  # elements of a sequence the evaluator builds (str * n, list * n, range)

_PURE_BUILTINS = {
    "abs": abs, "len": len, "sorted": sorted, "set": set, "frozenset": frozenset, "tuple": tuple,
    "list": list, "dict": dict, "round": round, "sum": sum, "min": min, "max": max, "float": float,
    "int": int, "str": str, "bool": bool, "range": range, "all": all, "any": any, "reversed": reversed,
}
_MATH = {"isclose": math.isclose, "fabs": math.fabs, "sqrt": math.sqrt, "floor": math.floor,
         "ceil": math.ceil, "inf": math.inf, "pi": math.pi, "e": math.e, "tau": math.tau, "nan": math.nan}
# Every node an accepted assert may contain (the evaluator handles exactly these).
_NODES = (ast.Constant, ast.Name, ast.Load, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp,
          ast.BoolOp, ast.Compare, ast.Subscript, ast.Slice, ast.Call, ast.Attribute, ast.keyword,
          ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd, ast.Invert, ast.Add, ast.Sub, ast.Mult, ast.Div,
          ast.FloorDiv, ast.Mod, ast.Pow, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is,
          ast.IsNot, ast.In, ast.NotIn)
_NUMBER = (int, float, complex, bool)
# Functions whose result depends only on the sequence their argument yields: the execution may
# send list(value) for a call they wrap (a generator, a deque, a map object ...).
_ITERATING = ("list", "tuple", "set", "frozenset", "sorted", "sum", "min", "max", "all", "any")


class NotSplittable(Exception):
    """The test uses a form the pool cannot judge by itself; the message says which."""


class _Slot:
    """Stands for the value of entry-point call ``index`` inside a check's expression."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


@dataclass(frozen=True)
class Check:
    expr: ast.expr  # the assert's test, with calls of the entry point as `_Slot` constants
    slots: tuple  # indices (into SplitTest.calls) of the calls it contains, in evaluation order
    source: str  # the assert as written (for messages)
    constants: dict  # NAME -> value as bound where the assert stands (loop variables included)


@dataclass(frozen=True)
class SplitTest:
    """An assert test rewritten into entry-point calls (sent to the worker) and checks (kept here)."""

    calls: tuple  # ((encoded args, encoded kwargs, iterate), ...) in execution order; iterate:
    #               the test only iterates over the value, so the execution sends list(value)
    checks: tuple  # Check, in the test's order


# ---------------------------------------------------------------------------------------------
# The evaluator (pool side; values are literals, the test's constants and decoded return values)


def _size_ok(n) -> None:
    if n > MAX_SIZE:
        raise NotSplittable(f"a value of more than {MAX_SIZE} elements")


def _binop(op, a, b):
    if isinstance(a, _NUMBER) and isinstance(b, _NUMBER):
        if isinstance(op, ast.Pow) and (abs(b) > 64 if isinstance(b, (int, float)) else True):
            raise ValueError("exponent too large for the pool's evaluator")
    elif isinstance(op, ast.Add) and type(a) is type(b) and isinstance(a, (str, list, tuple, bytes)):
        _size_ok(len(a) + len(b))
    elif isinstance(op, ast.Mult) and isinstance(a, (str, list, tuple, bytes)) and type(b) is int:
        _size_ok(len(a) * max(b, 0))
    elif isinstance(op, ast.Mult) and isinstance(b, (str, list, tuple, bytes)) and type(a) is int:
        _size_ok(len(b) * max(a, 0))
    else:
        raise TypeError(f"unsupported operands for {type(op).__name__}: {type(a).__name__}, {type(b).__name__}")
    return _BINOPS[type(op)](a, b)


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
           ast.Pow: lambda a, b: a ** b}
_CMPOPS = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
           ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
           ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def _func(node: ast.expr, names: dict):
    """The pure function a call node names (built-in or math.*), or NotSplittable."""
    if isinstance(node, ast.Name) and node.id in _PURE_BUILTINS and node.id not in names:
        return _PURE_BUILTINS[node.id]
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"
            and names.get("math") is math and node.attr in _MATH and callable(_MATH[node.attr])):
        return _MATH[node.attr]
    raise NotSplittable(f"calls {ast.unparse(node)}")


def evaluate(node: ast.expr, names: dict, slots: dict | None = None):
    """Value of ``node``. ``names`` holds the constants (and ``math`` where imported); ``slots``
    the decoded return values. Unknown forms raise NotSplittable; wrong values raise as Python
    would (TypeError, ZeroDivisionError, ...)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, _Slot):
            if slots is None:
                raise NotSplittable("an entry-point call where a constant is needed")
            return slots[node.value.index]
        return node.value
    if isinstance(node, ast.Name):
        if node.id in names and names[node.id] is not math:
            return names[node.id]
        raise NotSplittable(f"uses the name {node.id!r}")
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            raise NotSplittable("starred element")
        items = [evaluate(e, names, slots) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise NotSplittable("** in a dict display")
        return {evaluate(k, names, slots): evaluate(v, names, slots) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        v = evaluate(node.operand, names, slots)
        if isinstance(node.op, ast.Not):
            return not v
        if not isinstance(v, _NUMBER):
            raise TypeError(f"bad operand type for unary {type(node.op).__name__}: {type(v).__name__}")
        return -v if isinstance(node.op, ast.USub) else +v if isinstance(node.op, ast.UAdd) else ~v
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise NotSplittable(f"operator {type(node.op).__name__}")
        return _binop(node.op, evaluate(node.left, names, slots), evaluate(node.right, names, slots))
    if isinstance(node, ast.BoolOp):
        v = None
        for e in node.values:
            v = evaluate(e, names, slots)
            if (not v) if isinstance(node.op, ast.And) else v:
                return v
        return v
    if isinstance(node, ast.Compare):
        left = evaluate(node.left, names, slots)
        for op, right_node in zip(node.ops, node.comparators):
            right = evaluate(right_node, names, slots)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Subscript):
        v = evaluate(node.value, names, slots)
        s = node.slice
        if isinstance(s, ast.Slice):
            idx = slice(*(evaluate(x, names, slots) if x is not None else None for x in (s.lower, s.upper, s.step)))
        else:
            idx = evaluate(s, names, slots)
        if not isinstance(v, (str, bytes, list, tuple, dict)):
            raise TypeError(f"'{type(v).__name__}' object is not subscriptable")
        return v[idx]
    if isinstance(node, ast.Attribute):
        if (isinstance(node.value, ast.Name) and node.value.id == "math" and names.get("math") is math
                and node.attr in _MATH and not callable(_MATH[node.attr])):
            return _MATH[node.attr]
        raise NotSplittable(f"attribute {ast.unparse(node)}")
    if isinstance(node, ast.Call):
        fn = _func(node.func, names)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise NotSplittable("*args or **kwargs")
        allowed_kw = {math.isclose: {"rel_tol", "abs_tol"}, sorted: {"reverse"}, round: {"ndigits"}}.get(fn, set())
        if any(k.arg not in allowed_kw for k in node.keywords):
            raise NotSplittable(f"keyword arguments to {ast.unparse(node.func)}")
        args = [evaluate(a, names, slots) for a in node.args]
        kwargs = {k.arg: evaluate(k.value, names, slots) for k in node.keywords}
        if fn is range:
            r = range(*args)
            _size_ok(len(r))
            return r
        if fn in (list, tuple, set, frozenset, sorted, sum, min, max, all, any) and args and isinstance(args[0], range):
            _size_ok(len(args[0]))
        out = fn(*args, **kwargs)
        return list(out) if fn is reversed else out
    raise NotSplittable(f"expression {type(node).__name__}")


# ---------------------------------------------------------------------------------------------
# Parsing a test


class _Splitter:
    def __init__(self, entry_point: str):
        self.entry_point = entry_point
        self.calls: list = []
        self.checks: list = []
        self.constants: dict = {}

    def _call_slots(self, node: ast.expr, callee: str, names: dict) -> tuple[ast.expr, tuple]:
        """Copy of ``node`` with each call of ``callee`` evaluated to its arguments and replaced by
        a slot; returns (new node, slot indices in evaluation order)."""
        slots = []
        outer = self

        class Rewriter(ast.NodeTransformer):
            def visit_Call(self, call):
                if (isinstance(call.func, ast.Name) and call.func.id in _ITERATING and len(call.args) == 1
                        and isinstance(call.args[0], ast.Call)):
                    call.args[0].fastcrit_iterate = True  # the test only iterates over that value
                if isinstance(call.func, ast.Name) and call.func.id == callee:
                    for sub in ast.walk(ast.Module(body=[ast.Expr(a) for a in call.args] +
                                                   [ast.Expr(k.value) for k in call.keywords], type_ignores=[])):
                        if isinstance(sub, ast.Name) and sub.id == callee:
                            raise NotSplittable("the entry point used inside a call's arguments")
                    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                        raise NotSplittable("*args or **kwargs in an entry-point call")
                    args = [evaluate(a, names) for a in call.args]
                    kwargs = {k.arg: evaluate(k.value, names) for k in call.keywords}
                    try:
                        enc = ([to_typed(a) for a in args], {k: to_typed(v) for k, v in kwargs.items()},
                               getattr(call, "fastcrit_iterate", False))
                    except Exception as exc:  # _Plain: a range or another non-data argument
                        raise NotSplittable(f"argument not sendable as data: {exc}") from None
                    if len(outer.calls) >= MAX_CALLS:
                        raise NotSplittable(f"more than {MAX_CALLS} entry-point calls")
                    idx = len(outer.calls)
                    outer.calls.append(enc)
                    slots.append(idx)
                    return ast.copy_location(ast.Constant(_Slot(idx)), call)
                self.generic_visit(call)
                return call

            def visit_Name(self, name):
                if name.id == callee:
                    raise NotSplittable("the entry point used other than by calling it")
                return name

            def visit_Lambda(self, lam):
                raise NotSplittable("lambda")

        import copy

        new = Rewriter().visit(copy.deepcopy(node))
        return new, tuple(slots)

    def _assign(self, stmt: ast.Assign, names: dict, callee: str | None) -> None:
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            raise NotSplittable("an assignment other than NAME = constant")
        target = stmt.targets[0].id
        if target in (callee, self.entry_point, "math"):
            raise NotSplittable(f"rebinds {target!r}")
        for sub in ast.walk(stmt.value):
            if isinstance(sub, ast.Name) and sub.id in (callee, self.entry_point):
                raise NotSplittable("a variable bound to an entry-point call")
        names[target] = evaluate(stmt.value, names)

    def _assert(self, stmt: ast.Assert, names: dict, callee: str) -> None:
        expr, slots = self._call_slots(stmt.test, callee, names)
        # Check now that everything else in the expression is known (a slot stands for any value).
        funcs = set()
        for sub in ast.walk(expr):
            if isinstance(sub, ast.Call):
                _func(sub.func, names)
                funcs.add(id(sub.func))
            if isinstance(sub, ast.Attribute):  # math.<name>; checked below
                funcs.add(id(sub.value))
        for sub in ast.walk(expr):
            if isinstance(sub, ast.Name) and id(sub) not in funcs and (sub.id not in names or names[sub.id] is math):
                raise NotSplittable(f"uses the name {sub.id!r}")
            if not isinstance(sub, _NODES):
                raise NotSplittable(f"expression {type(sub).__name__} in an assert")
            if isinstance(sub, ast.Attribute) and not (
                    isinstance(sub.value, ast.Name) and sub.value.id == "math" and names.get("math") is math
                    and sub.attr in _MATH):
                raise NotSplittable(f"attribute {ast.unparse(sub)}")
            if isinstance(sub, ast.Dict) and any(k is None for k in sub.keys):
                raise NotSplittable("** in a dict display")
            if isinstance(sub, (ast.List, ast.Tuple, ast.Set)) and any(isinstance(e, ast.Starred) for e in sub.elts):
                raise NotSplittable("starred element")
        consts = {k: v for k, v in names.items() if k != "\0mutable-passed"}
        self.checks.append(Check(expr, slots, ast.unparse(stmt)[:200], consts))
        self._mutable_args_used(stmt, names, callee)

    @staticmethod
    def _mutable_args_used(stmt, names, callee):
        # A constant passed to the entry point may be changed by it in the process; later uses of
        # the name would then see the change there but not here.
        for sub in ast.walk(stmt.test):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == callee:
                for a in list(sub.args) + [k.value for k in sub.keywords]:
                    for n in ast.walk(a):
                        if isinstance(n, ast.Name) and isinstance(names.get(n.id), (list, dict, set)):
                            names.setdefault("\0mutable-passed", set()).add(n.id)

    def _body(self, body: list, names: dict, callee: str) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                continue
            if isinstance(stmt, ast.Assign):
                self._assign(stmt, names, callee)
            elif isinstance(stmt, ast.Assert):
                self._assert(stmt, names, callee)
            elif isinstance(stmt, ast.For) and not stmt.orelse and isinstance(stmt.target, ast.Name) \
                    and isinstance(stmt.iter, ast.Call) and isinstance(stmt.iter.func, ast.Name) \
                    and stmt.iter.func.id == "range" and "range" not in names:
                r = evaluate(stmt.iter, names)
                if len(r) > MAX_UNROLL:
                    raise NotSplittable(f"a loop of more than {MAX_UNROLL} passes")
                if stmt.target.id in (callee, self.entry_point, "math"):
                    raise NotSplittable(f"rebinds {stmt.target.id!r}")
                for v in r:
                    names[stmt.target.id] = v
                    self._body(stmt.body, names, callee)
            else:
                raise NotSplittable(f"statement {type(stmt).__name__}: {ast.unparse(stmt)[:80]}")

    def split(self, source: str) -> SplitTest:
        try:
            module = ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            raise NotSplittable(f"does not parse: {exc}") from None
        names: dict = {}
        check_def = None
        called = False
        for stmt in module.body:
            if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                continue
            if called:
                raise NotSplittable("statements after check(...)")
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if bound in (self.entry_point, "check"):
                        raise NotSplittable(f"an import rebinds {bound!r}")
                    if isinstance(stmt, ast.Import) and alias.name == "math" and alias.asname in (None, "math"):
                        names["math"] = math
                    else:
                        names.pop(bound, None)  # unknown to the evaluator
                continue
            if isinstance(stmt, ast.Assign):
                self._assign(stmt, names, None)
            elif isinstance(stmt, ast.Assert):
                self._assert(stmt, names, self.entry_point)
            elif isinstance(stmt, ast.FunctionDef) and stmt.name == "check":
                a = stmt.args
                if (check_def is not None or stmt.decorator_list or a.posonlyargs or a.vararg or a.kwarg
                        or a.kwonlyargs or a.defaults or len(a.args) != 1):
                    raise NotSplittable("a check function other than def check(candidate)")
                check_def = stmt
            elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                  and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check"):
                c = stmt.value
                if (check_def is None or c.keywords or len(c.args) != 1 or not isinstance(c.args[0], ast.Name)
                        or c.args[0].id != self.entry_point):
                    raise NotSplittable(f"a call {ast.unparse(c)[:80]} other than check({self.entry_point})")
                param = check_def.args.args[0].arg
                local = dict(names)
                local.pop(param, None)
                self._body(check_def.body, local, param)
                if local.get("\0mutable-passed"):
                    raise NotSplittable("a list/dict/set constant passed to the entry point")
                called = True
            else:
                raise NotSplittable(f"statement {type(stmt).__name__}: {ast.unparse(stmt)[:80]}")
        if names.get("\0mutable-passed"):
            raise NotSplittable("a list/dict/set constant passed to the entry point")
        if check_def is not None and not called:
            raise NotSplittable("check(...) is defined but never called")
        if not self.checks:
            raise NotSplittable("no assert")
        return SplitTest(tuple(self.calls), tuple(self.checks))


@functools.lru_cache(maxsize=4096)
def _split_cached(source: str, entry_point: str):
    try:
        return _Splitter(entry_point).split(source), ""
    except NotSplittable as exc:
        return None, str(exc)
    except (ValueError, TypeError, ArithmeticError, KeyError, IndexError, RecursionError, MemoryError) as exc:
        return None, f"a constant could not be computed: {type(exc).__name__}: {exc}"


def split_test(source: str, entry_point: str | None) -> SplitTest | None:
    """The pool-judged form of one assert test, or None (then the test runs in the process).
    Results are cached by (source, entry point): RL runs test many samples against the same tests."""
    if not entry_point:
        return None
    return _split_cached(source, entry_point)[0]


def why_not(source: str, entry_point: str | None) -> str:
    """Why ``split_test`` returns None for this test ("" when it does not)."""
    if not entry_point:
        return "no entry_point"
    return _split_cached(source, entry_point)[1]


def _short_repr(value, width: int = 80) -> str:
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int with more digits than str() may write, a deep value
        return f"<{type(value).__name__} that cannot be shown>"
    return text if len(text) <= width else text[:width - 3] + "..."


def judge_split(split: SplitTest, raw: list) -> tuple[str, str]:
    """(status, message) of one split test from the worker's answers for its calls (``raw[k]``:
    ``{"status", "message", "value"}``, in ``split.calls`` order). Asserts are taken in order, as the
    process would run them: the first one whose call did not return, or that is false, or that
    raises here, decides."""
    decoded: dict = {}
    for check in split.checks:
        for k in check.slots:
            r = raw[k]
            st = r.get("status")
            if st != "returned":
                if st == "passed":  # the worker never judges calls: a "passed" is not ours
                    return "error", "sandbox worker sent an unjudged pass"
                return (st if st in ("failed", "error", "timeout", "memory", "output_limit", "skipped")
                        else "error"), str(r.get("message", ""))[:500]
            if k not in decoded:
                try:
                    decoded[k] = from_typed(r.get("value"))
                except (ValueError, TypeError, KeyError, ArithmeticError, RecursionError, MemoryError) as exc:
                    # The trusted encoder never sends such a value: a forged record, or our bug.
                    return "error", f"sandbox could not decode the returned value: {type(exc).__name__}: {exc}"[:500]
        try:
            ok = evaluate(check.expr, check.constants, decoded)
        except NotSplittable as exc:  # cannot happen for an accepted test; never a pass
            return "error", f"sandbox pool evaluator: {exc}"
        except Exception as exc:  # as the process would raise it: the test errs
            return "error", f"{type(exc).__name__}: {exc}"[:500]
        if not ok:  # the values the program returned, for feedback (expected is in the source)
            got = ", ".join(_short_repr(decoded[k]) for k in check.slots)
            return "failed", f"AssertionError: {check.source[:400]} (returned {got})"[:500]
    return "passed", ""
