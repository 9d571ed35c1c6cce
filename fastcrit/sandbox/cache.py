"""Result cache keyed by (AST-normalised code, tests, limits), persisted in sqlite.

Normalisation parses the code and prints it back (comments and formatting vanish) after renaming
each function's local variables canonically (``_v0``, ``_v1`` ... in order of first binding), so
programs that differ only in local names, comments, blank lines or quoting hit the same entry.

What it does not rename, to stay exact: parameters (callers may pass them by keyword), globals,
attributes, names declared ``global``/``nonlocal``, and anything in a function that calls
``locals``/``vars``/``eval``/``exec``/``dir`` (which can observe names). Code that does not parse is
keyed by its raw text. Docstrings are kept (they are observable). Only the verdicts are shared
between equivalent programs: a hit returns the stdout/stderr tails of the program first run.

Results with a timeout or a job-level error (worker died, refused) are not stored: they may depend
on load rather than on the program.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import sqlite3
import threading
import time

from .types import ERROR, TIMEOUT, Job, Result

_DYNAMIC = {"locals", "vars", "eval", "exec", "dir"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp,
           ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _own_scope_nodes(fn):
    """Nodes of ``fn``'s own scope (nested function/class/lambda/comprehension bodies excluded)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _bound_locals(fn) -> list[str]:
    """Names ``fn`` binds by plain assignment in its own scope that are safe to rename, in order
    of first appearance."""
    unsafe = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    for a in (fn.args.vararg, fn.args.kwarg):
        if a is not None:
            unsafe.add(a.arg)
    for node in ast.walk(fn):
        if node is fn:
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            unsafe.update(node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            unsafe.update(x.arg for x in args.posonlyargs + args.args + args.kwonlyargs)
            unsafe.update(x.arg for x in (args.vararg, args.kwarg) if x is not None)
            if not isinstance(node, ast.Lambda):
                unsafe.add(node.name)
        elif isinstance(node, ast.ClassDef):
            unsafe.add(node.name)
            unsafe.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
        elif isinstance(node, ast.alias):
            unsafe.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            unsafe.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            unsafe.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            unsafe.add(node.rest)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _DYNAMIC:
            return []
    order, seen = [], set()
    # first-binding order must follow the source, so sort the own-scope stores by position
    stores = sorted((n for n in _own_scope_nodes(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)),
                    key=lambda n: (n.lineno, n.col_offset))
    for n in stores:
        if n.id not in seen and n.id not in unsafe:
            seen.add(n.id)
            order.append(n.id)
    return order


class _Renamer(ast.NodeTransformer):
    def _rename_function(self, fn):
        names = _bound_locals(fn)
        taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
        mapping, k = {}, 0
        for name in names:
            while f"_v{k}" in taken:
                k += 1
            mapping[name] = f"_v{k}"
            k += 1
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and node.id in mapping:
                node.id = mapping[node.id]
        return fn

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        return self._rename_function(node)

    visit_AsyncFunctionDef = visit_FunctionDef


def normalise(code: str) -> str:
    """Canonical text of ``code``; the raw text when it does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "\0raw\0" + code
    try:
        tree = _Renamer().visit(tree)
        return ast.unparse(tree)
    except (RecursionError, ValueError):
        return "\0raw\0" + code


def job_key(job: Job) -> str:
    payload = json.dumps(
        {"code": normalise(job.code), "kind": job.kind, "tests": job.tests, "entry_point": job.entry_point,
         "timeout_s": job.timeout_s, "memory_mb": job.memory_mb, "run_all_cases": job.run_all_cases},
        sort_keys=True, default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()


def cacheable(result: Result) -> bool:
    return not result.message and all(t.status not in (TIMEOUT,) for t in result.tests) and not (
        result.status == ERROR and not result.tests)


class ResultCache:
    """sqlite-backed; safe to share between threads of one process and between processes."""

    def __init__(self, path: str):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, result TEXT NOT NULL, "
                         "created REAL NOT NULL)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def get(self, key: str) -> Result | None:
        with self._lock:
            row = self._db.execute("SELECT result FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        r = Result.from_dict(json.loads(row[0]))
        r.cached = True
        return r

    def put(self, key: str, result: Result) -> None:
        if not cacheable(result):
            return
        d = result.to_dict()
        d["cached"] = False
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?)", (key, json.dumps(d), time.time()))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0]

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hit_rate, "entries": len(self)}

    def close(self) -> None:
        with self._lock:
            self._db.close()
