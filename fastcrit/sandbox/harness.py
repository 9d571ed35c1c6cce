"""What runs inside a forked execution: the program, and the trusted code around it. The judging
itself happens elsewhere: ``stdio`` and ``call`` outputs are compared in the pool (compare.py),
``assert`` tests run in the judge (judge.py). Nothing here decides a pass, so nothing a program
does to this process can forge one.

- ``run_program`` (``stdio``): the code as ``__main__``, reading stdin.
- ``run_tests`` (``call``): the code, then the entry point called with each test's arguments; the
  return values go to the worker as JSON records on fd 3 (signed, so that a record's boundaries and
  order are the harness's; a program that reaches the key can only claim a return value, which it
  could have returned).
- ``serve`` (``assert``): the code, then answers to the judge's requests (call this, iterate over
  that) on fds 3 and 4, values crossing as data (wire.py).
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import types
from time import monotonic as _monotonic

from . import wire

# ---------------------------------------------------------------------------------------------
# Captured before any untrusted code runs (this module is imported by the warm worker)

_PRISTINE_BUILTINS = dict(builtins.__dict__)
_BaseException = BaseException
_Exception = Exception
_MemoryError = MemoryError
_SystemExit = SystemExit
_OSError = OSError
_EFBIG, _ENOSPC = 27, 28
_type, _len, _isinstance, _str, _repr = type, len, isinstance, str, repr
_os_write, _os_exit = os.write, os._exit

_json_dumps = json.dumps
try:  # the built-in BLAKE2 module: hashlib would map OpenSSL into every warm worker (pages each fork copies)
    from _blake2 import blake2b as _blake2b
except ImportError:  # pragma: no cover
    from hashlib import blake2b as _blake2b
_FunctionType = types.FunctionType
_ModuleType = types.ModuleType


def prepare_worker(preimport) -> list[str]:
    """In the warm worker, before any fork: import common modules. Returns those that failed."""
    failed = []
    for name in preimport:
        try:
            __import__(name)
        except Exception:
            failed.append(name)
    # Objects alive now are never collected: a forked execution's garbage collector then leaves
    # their pages alone instead of touching (and copying) them all.
    import gc

    gc.collect()
    gc.freeze()
    return failed


class _Plain(Exception):
    pass


def to_plain(value, depth=0):
    """Rebuild ``value`` from exact built-in types (``call`` tests: JSON data)."""
    if depth > 100:
        raise _Plain("value nested too deeply")
    t = _type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return float(value)
    if t is list or t is tuple:
        return [to_plain(v, depth + 1) for v in value]
    if t is dict:
        out = {}
        for k, v in value.items():
            if _type(k) is not str:
                raise _Plain(f"dict key of type {_type(k).__name__} (only str keys are compared)")
            out[k] = to_plain(v, depth + 1)
        return out
    raise _Plain(f"returned a {t.__name__}, not a plain value (None/bool/int/float/str/list/tuple/dict)")


class Reporter:
    """Writes signed records to the result pipe: ``body \t mac``, where mac is a keyed BLAKE2b
    of (sequence number, body) with a per-run random key (one C call per record)."""

    def __init__(self, fd: int, key: bytes):
        self._fd = fd
        self._key = key
        self._seq = 0

    def send(self, payload: dict) -> None:
        view = memoryview(self.line(payload))
        while view:
            n = _os_write(self._fd, view)
            view = view[n:]

    def line(self, payload: dict) -> bytes:
        # Fields joined by \x1f; no json encoder object is built (cheaper in a fresh child).
        # ``v`` is JSON (which escapes control characters); ``m`` is flattened to one line.
        v = payload.get("v", _NO_VALUE)
        m = _str(payload.get("m", "")).replace("\x1f", " ").replace("\n", " ").replace("\t", " ")
        t = payload.get("t")
        body = "\x1f".join(
            (
                payload["k"],
                _str(payload.get("i", -1)),
                payload.get("s", ""),
                _repr(_monotonic() if t is None else t),
                "" if v is _NO_VALUE else _json_dumps(v),
                m,
            )
        ).encode("utf-8", "replace")
        mac = _blake2b(b"%d:" % self._seq + body, key=self._key, digest_size=16).hexdigest().encode()
        self._seq += 1
        return body + b"\t" + mac + b"\n"


_NO_VALUE = object()


def _describe(exc) -> str:
    try:
        text = f"{_type(exc).__name__}: {exc}"
    except _BaseException:
        text = "exception (unprintable)"
    return text[:500]


def _main_namespace(builtins_dict: dict) -> dict:
    """A fresh ``__main__`` module for the solution (dataclasses and pickle look it up)."""
    mod = types.ModuleType("__main__")
    g = mod.__dict__
    g["__builtins__"] = builtins_dict
    sys.modules["__main__"] = mod
    return g


# Programs up to this many characters are compiled in the worker; a longer one is compiled by its
# execution, under its limits: compiling takes about a second per 2 MB of source (more for some
# shapes) and memory to match, which the worker, with no limits, must not spend on a program's word.
COMPILE_IN_WORKER_MAX = 32 << 10


class Prepared:
    """Everything an execution needs, made in the worker before the fork so that the child
    does not parse or copy anything shared (each page it writes is copied)."""

    def __init__(self, view: dict, start: int = 0):
        self.view = view
        self.start = start
        self.error = None
        self.code = None
        if _len(view["code"]) <= COMPILE_IN_WORKER_MAX:
            self.compile()
        self.builtins = dict(_PRISTINE_BUILTINS)

    def compile(self) -> None:
        try:
            self.code = compile(self.view["code"], "<solution>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            self.error = _describe(exc)


def _load(prep: Prepared, g: dict):
    """Run the program's code; None, or (status, message) when it did not load."""
    if prep.code is None and prep.error is None:
        prep.compile()  # a long program: compiled here, in the execution
    if prep.error is not None:
        return "error", prep.error
    try:
        _FunctionType(prep.code, g)()
    except _MemoryError as exc:
        return "memory", _describe(exc)
    except _OSError as exc:
        return ("output_limit" if exc.errno in (_EFBIG, _ENOSPC) else "error"), _describe(exc)
    except _BaseException as exc:
        return "error", _describe(exc)
    return None


def run_tests(prep: Prepared, reporter: Reporter) -> None:
    """``call`` kind: run the code, then call the entry point for tests ``prep.start..`` in this
    (already forked and limited) process, one record per test. Never returns."""
    view, start = prep.view, prep.start
    g = _main_namespace(prep.builtins)
    failed = _load(prep, g)
    if failed is not None:
        reporter.send({"k": "code", "s": failed[0], "m": failed[1]})
        _os_exit(0)
    reporter.send({"k": "loaded"})
    ep = view.get("entry_point")
    fn = g.get(ep) if ep else None
    if fn is None and ep and _isinstance(g.get("Solution"), _type):
        try:
            fn = getattr(g["Solution"](), ep)
        except _BaseException:
            fn = None
    for i in range(start, _len(view["tests"])):
        t = view["tests"][i]
        status, msg, value = "passed", "", None
        try:
            if fn is None or not callable(fn):
                raise NameError(f"entry point {ep!r} is not defined")
            value = to_plain(fn(*t["args"], **t["kwargs"]))
        except _Plain as exc:
            status, msg = "error", _str(exc)
        except _MemoryError as exc:
            status, msg = "memory", _describe(exc)
        except _OSError as exc:  # EFBIG: past RLIMIT_FSIZE; ENOSPC: scratch tmpfs full
            status = "output_limit" if exc.errno in (_EFBIG, _ENOSPC) else "error"
            msg = _describe(exc)
        except _BaseException as exc:
            status, msg = "error", _describe(exc)
        if status == "passed":
            try:
                reporter.send({"k": "test", "i": i, "s": status, "m": "", "v": value})
            except (ValueError, TypeError, OverflowError) as exc:
                reporter.send({"k": "test", "i": i, "s": "error", "m": f"unserialisable return value: {exc}"})
                status = "error"
        else:
            reporter.send({"k": "test", "i": i, "s": status, "m": msg})
        # A returned value is judged by the pool; only failures seen here stop the run.
        if status != "passed" and not view["run_all_cases"]:
            break
    _os_exit(0)


# ---------------------------------------------------------------------------------------------
# ``assert``: the program's side of the judge's requests


def _builtin_base(exc) -> str | None:
    """Name of the first built-in ``Exception`` class ``exc`` derives from (None for a
    BaseException such as SystemExit, which no test should be able to catch as an answer)."""
    try:
        for c in _type(exc).__mro__:
            if c.__module__ == "builtins" and c.__name__ in _PRISTINE_BUILTINS:
                return c.__name__ if _isinstance(exc, _Exception) else None
    except _BaseException:
        pass
    return "Exception" if _isinstance(exc, _Exception) else None


class _JudgeFn:
    """A function of the test's, held by the judge: calling it asks the judge (call only)."""

    __slots__ = ("_s", "_h")

    def __init__(self, server, h):
        self._s, self._h = server, h

    def __call__(self, *args, **kwargs):
        s = self._s
        s.send({"cb": self._h, "a": [s.enc(a) for a in args], "k": [[k, s.enc(v)] for k, v in kwargs.items()]})
        while True:
            m = s.read()
            if _type(m) is not dict:
                _os_exit(0)
            if "op" in m:  # the judge's function calls the program in turn
                s.send(s.answer(m))
                continue
            if "ok" in m:
                return s.dec(m["ok"])
            exc = m.get("exc") or ["Exception", ""]
            cls = _PRISTINE_BUILTINS.get(exc[0]) if _type(exc) is list and exc and _type(exc[0]) is str else None
            if not (_isinstance(cls, _type) and issubclass(cls, _Exception)):
                cls = _Exception
            raise cls(*exc[1:2])


class _Server:
    def __init__(self, g: dict, rd: int, wr: int):
        self.g, self.rd, self.wr = g, wire.Reader(rd), wr
        self.objs: dict = {}
        self.enc = wire.encoder(self._handle)
        self.dec = wire.decoder(lambda h, name: _JudgeFn(self, h), self._own)

    def _handle(self, v):
        self.objs[id(v)] = v
        out = {"h": id(v), "n": _str(_type(v).__name__)[:80]}
        if _isinstance(v, _ModuleType) and _type(getattr(v, "__name__", None)) is str:
            out["m"] = v.__name__
        return out

    def _own(self, k):
        try:
            return self.objs[k]
        except KeyError:
            raise wire.WireError("unknown handle") from None

    def read(self):
        try:
            return self.rd.recv(1 << 31)[0]
        except (wire.WireError, OSError):
            return None

    def send(self, msg) -> None:
        try:
            body = wire.dumps(msg)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            body = wire.dumps({"bad": f"the value cannot be sent: {_describe(exc)}"})
        try:
            wire.send_body(self.wr, body)
        except _OSError:
            _os_exit(0)

    def answer(self, m):
        try:
            op = m["op"]
            if op == "get":
                return {"ok": [[n, self.enc(self.g[n])] for n in m["names"] if _type(n) is str and n in self.g]}
            if op == "plan":  # the test's first calls, made now (callplan.py)
                return {"plan": self._plan(m["calls"])}
            obj = self._own(m["h"])
            if op == "call":
                sent = m["a"]
                args = self.dec(sent)
                kwargs = self.dec({"d": m["k"]})
                out = {"ok": self.enc(obj(*args, **kwargs))}
                changed = {}
                for i, a in enumerate(args):  # a list, dict or set the call changed goes back
                    t = _type(a)
                    if t is list or t is dict or t is set:
                        now = self.enc(a)
                        if now != sent[i]:
                            changed[_str(i)] = now
                if changed:
                    out["w"] = changed
                return out
            if op == "next":
                items = []
                try:
                    for _ in range(max(1, min(int(m["n"]), 256))):
                        items.append(self.enc(next(obj)))
                except StopIteration:
                    return {"ok": items}
                except _BaseException as exc:
                    return dict(self._exc(exc), ok=items)
                return {"ok": items}
            if op == "attr":
                v = getattr(obj, _str(m["a"]))
            elif op == "iter":
                v = iter(obj)
            elif op == "len":
                v = _len(obj)
            elif op == "bool":
                v = bool(obj)
            elif op == "index":
                v = obj.__index__()
            elif op == "float":
                v = float(obj)
            elif op == "item":
                v = obj[self.dec(m["k"])]
            else:
                return {"bad": f"unknown request {op!r}"}
            return {"ok": self.enc(v)}
        except wire.WireError as exc:
            return {"bad": _str(exc)}
        except _BaseException as exc:
            return self._exc(exc)

    def _plan(self, calls) -> list:
        out = []
        for name, a, k in calls:
            if _type(name) is not str or name not in self.g:
                out.append({"missing": True})
                break
            fn = self.g[name]
            try:
                reply = {"ok": self.enc(fn(*self.dec(a), **self.dec({"d": k}))), "id": id(fn)}
            except wire.WireError as exc:
                reply = {"bad": _str(exc)}
            except _BaseException as exc:
                reply = dict(self._exc(exc), id=id(fn))
            out.append(reply)
            if "ok" not in reply:
                break  # the test stops at this call
        return out

    @staticmethod
    def _exc(exc) -> dict:
        if _isinstance(exc, _MemoryError):
            return {"st": "memory", "m": _describe(exc)}
        if _isinstance(exc, _OSError) and exc.errno in (_EFBIG, _ENOSPC):
            return {"st": "output_limit", "m": _describe(exc)}
        name = _builtin_base(exc)
        if name is None:
            return {"bad": f"the program raised {_describe(exc)}"}
        try:
            msg = _str(exc)[:300]
        except _BaseException:
            msg = ""
        return {"exc": [name, msg]}


def serve(prep: Prepared, rd: int, wr: int) -> None:
    """``assert`` kind: load the code, then answer the judge until it hangs up. Never returns."""
    g = _main_namespace(prep.builtins)
    failed = _load(prep, g)
    loaded = _monotonic()
    server = _Server(g, rd, wr)
    if failed is not None:
        if server.read() is not None:
            server.send({"load": list(failed)})
        _os_exit(0)
    first = True
    while True:
        m = server.read()
        if _type(m) is not dict:
            _os_exit(0)
        reply = server.answer(m)
        if first:  # when the program finished loading: the judge's "loaded" (clamped there)
            reply["t"], first = loaded, False
        server.send(reply)


def run_program(prep: Prepared) -> None:
    """stdio kind: run the code as __main__ reading stdin; exit status 1 on an uncaught exception.
    Never returns."""
    g = _main_namespace(prep.builtins)
    status = 0
    try:
        if prep.code is None and prep.error is None:
            prep.compile()  # a long program: compiled here, in the execution
        if prep.error is not None:
            raise SyntaxError(prep.error)
        _FunctionType(prep.code, g)()
    except _OSError as exc:
        status = 3 if exc.errno in (_EFBIG, _ENOSPC) else 1
        try:
            sys.stderr.write(f"{_describe(exc)}\n")
        except _BaseException:
            pass
    except _SystemExit as exc:
        c = exc.code
        status = 0 if c is None else c if _type(c) is int else 1
        if c is not None and _type(c) is not int:
            try:
                sys.stderr.write(_str(c) + "\n")
            except _BaseException:
                pass
    except _BaseException:
        import traceback

        try:
            traceback.print_exc()
        except _BaseException:
            pass
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except _BaseException:
            status = status or 1
    _os_exit(status & 0xFF)
