"""The calls a test is sure to make first, read from its source before it runs (judge.py).

Each call of the program costs a round trip between the judge and the execution. Most tests,
though, begin with straight-line asserts whose calls of the program have literal arguments
(``assert candidate([1, 2]) == 3``, HumanEval's ``def check(candidate): ...`` then
``check(entry_point)``). ``plan`` lists those calls, in the order Python will make them, up to
the first statement or expression it cannot follow. The judge asks the execution to make them all
in one request before the test runs, then hands each answer to the test as it makes the call.

The judge checks every call against the plan as the test runs: the same object, the same
arguments, in the same order, and no other request to the execution in between. Anything else
(a plan this module got wrong) and the test is run again in a fresh execution without a plan, so
a plan can make a test faster but never changes what it sees, except in one way: a test that
stops early (an assert fails, a call raises) leaves planned calls made that it would not have
made. The execution stops at the first call that raises; calls after a wrong value run, within
the test's time limit, and the job's next test then starts in a fresh execution, so no later test
sees a program state they left.
"""

from __future__ import annotations

import ast
import builtins

_BUILTIN_NAMES = frozenset(dir(builtins))
# Statements whose order of evaluation is plain. Anything else ends the plan.
_STATEMENTS = (ast.Assert, ast.Assign, ast.Expr, ast.Import, ast.ImportFrom, ast.Pass, ast.FunctionDef)
# Expressions evaluated left to right, every part of them, each exactly once.
_EAGER = (
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.Call,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.keyword,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
)


class _Stop(Exception):
    pass


def plan(source: str) -> list:
    """``[(program name, args, kwargs), ...]``: the calls the test makes first, in order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    return plan_tree(tree)


def plan_tree(tree: ast.Module) -> list:
    """``plan`` of a parsed test."""
    out: list = []
    try:
        _Planner(tree, out).module()
    except _Stop:
        pass
    except (RecursionError, MemoryError):
        return []
    return out


def _bound(tree) -> set:
    """Every name the test binds anywhere (assignments, defs, classes, parameters, imports ...)."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.alias):
            names.add((n.asname or n.name).partition(".")[0])
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            names.update(n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


class _Planner:
    def __init__(self, tree: ast.Module, out: list):
        self.tree, self.out = tree, out
        # Names the test never binds and Python does not provide: the judge looks them up in the
        # program. Calls of these (or of a parameter bound to one) are the program's.
        loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        self.program = loads - _bound(tree) - _BUILTIN_NAMES
        self.defs: dict = {}  # test-defined functions seen so far

    def module(self) -> None:
        self.body(self.tree.body, {n: n for n in self.program})

    def body(self, stmts, callees: dict) -> None:
        """``callees``: name in this scope -> the program's name it stands for."""
        for st in stmts:
            if not isinstance(st, _STATEMENTS):
                raise _Stop
            if isinstance(st, ast.FunctionDef):
                a = st.args
                if (
                    st.decorator_list
                    or a.defaults
                    or a.kw_defaults
                    or st.returns
                    or any(x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs)
                ):
                    raise _Stop
                self.defs[st.name] = st
                continue
            if isinstance(st, (ast.Import, ast.ImportFrom, ast.Pass)):
                continue
            if isinstance(st, ast.Expr) and self._descend(st.value, callees):
                continue
            if isinstance(st, ast.Assign):
                if not all(isinstance(t, ast.Name) for t in st.targets):
                    raise _Stop
                if self._calls_program(st.value, callees):
                    raise _Stop  # the name would hold a program value, maybe a handle: stop here
                self.expr(st.value, callees)
                continue
            if isinstance(st, ast.Assert) and st.msg is not None and self._calls_program(st.msg, callees):
                raise _Stop
            self.expr(st.test if isinstance(st, ast.Assert) else st.value, callees)

    def _descend(self, call, callees: dict) -> bool:
        """HumanEval's ``check(entry_point)``: plan the check function's body with its parameter
        standing for the program's function."""
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id in self.defs
            and not call.keywords
            and len(call.args) == 1
            and isinstance(call.args[0], ast.Name)
            and call.args[0].id in callees
        ):
            return False
        fn = self.defs.pop(call.func.id)  # planned once: a second call would repeat its calls
        a = fn.args
        if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or len(a.args) != 1:
            raise _Stop
        local = _bound(ast.Module(body=fn.body, type_ignores=[])) | {a.args[0].arg}
        inner = {n: p for n, p in callees.items() if n not in local}
        inner[a.args[0].arg] = callees[call.args[0].id]
        self.body(fn.body, inner)
        return True

    def _calls_program(self, node, callees: dict) -> bool:
        return any(isinstance(n, ast.Name) and n.id in callees for n in ast.walk(node))

    def expr(self, node, callees: dict) -> None:
        """Add the program's calls in ``node`` in evaluation order (children left to right, then
        the call itself); stop at anything that is not plain."""
        if not self._calls_program(node, callees):
            if any(isinstance(n, ast.Name) and n.id in self.defs for n in ast.walk(node)):
                raise _Stop  # a function of the test's: its body may call the program
            return  # the program is not involved: whatever it is, it runs in the judge alone
        if not isinstance(node, _EAGER):
            raise _Stop  # and, or, if-else, comprehensions, lambdas: not every part runs, or not once
        if isinstance(node, ast.Name):
            raise _Stop  # the program's function used other than by calling it
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in callees:
                if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                    raise _Stop
                try:
                    args = [ast.literal_eval(a) for a in node.args]
                    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    raise _Stop from None
                self.out.append((callees[f.id], args, kwargs))
                return
            if isinstance(f, ast.Name) and f.id in self.defs:
                raise _Stop
            self.expr(f, callees)
            for a in node.args:
                self.expr(a, callees)
            for k in node.keywords:
                self.expr(k.value, callees)
            return
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            raise _Stop  # on a program's value, maybe a handle: a request of its own
        if isinstance(node, ast.Compare) and len(node.ops) > 1:
            raise _Stop  # a chain stops at the first false comparison
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if k is None:
                    raise _Stop
                self.expr(k, callees)
                self.expr(v, callees)
            return
        for child in ast.iter_child_nodes(node):
            self.expr(child, callees)
