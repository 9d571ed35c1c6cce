"""The judge: the process where ``assert`` tests run, outside the program's process.

Each warm worker forks one judge before any program runs and keeps it (a new one replaces it when
it dies or is stopped). The judge holds the tests of the job in hand; the program runs in a
separate execution (harness.serve) that holds nothing but the program. For each test the judge
runs the test's own source with its own, unpatched builtins. The names the test reads from the
program (the entry point, a class, a helper, a constant) are looked up in the execution once the
code has loaded: data comes across as data (wire.py), and anything else as a ``Remote`` handle.
Calling a handle sends the arguments as data and gets the return value back as data, so every
comparison, ``isinstance``, ``math.isclose`` or ``sorted`` of the test runs here, on objects the
judge built itself. A handle can be called, iterated, indexed, measured or asked for an attribute,
but never compared: a program object cannot vote on its own equality.

Nothing of the tests reaches the execution except the arguments the test passes (which the
program sees in any harness). The worker relays the tests from the pool to the judge without
reading them (``os.splice``), so they are in neither the worker's memory nor, therefore, the
execution's (a fork of the worker). The judge is not dumpable, so the execution, under the same
uid, cannot read its memory either; seccomp refuses ptrace. The worker bounds the judge's time
with the test's own limit and its memory with the job's ``memory_mb``.

Records to the worker (harness.Reporter, over the judge's socket): ``code`` (the program did not
load: every remaining test gets this status), ``loaded``, ``test`` (a verdict), ``stop`` (the
execution is gone or cannot go on: the worker gives the running test its end reason and starts a
fresh execution for the rest) and ``end``.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import sys
import time

from . import wire
from .harness import Reporter
from .judge_messages import _assert_message, _describe
from .judge_names import Withheld, import_or_withhold, module_names, own_modules

_BUILTINS = dict(builtins.__dict__)  # the worker never runs program code: these are the originals
_BUILTIN_NAMES = frozenset(_BUILTINS)
_EXCEPTIONS = {k: v for k, v in _BUILTINS.items() if isinstance(v, type) and issubclass(v, Exception)}
_COMPILED: dict = {}  # test source -> (code, names); tests repeat across the samples of a problem
_MAX_COMPILED = 1024


class ProgramLost(BaseException):
    """The execution ended, or broke the protocol, while the judge waited on it. A BaseException:
    a test's ``except Exception`` must not swallow it."""

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status  # None: the worker decides from how the execution ended


class Refused(BaseException):
    """Something the judge does not do with a program's value (compare a handle, read a value that
    is not data): the running test is an ``error`` even if the test catches it."""


class Diverged(BaseException):
    """The test did not make the calls its plan said (callplan.py): run it again without one."""


class Verdict(BaseException):
    """The program's call ended in a limit (memory, file size): the test gets that status."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class _TestBroken(Exception):
    """The test's own source does not compile."""


class ProgramError(Exception):
    """An exception of the program that is not one of the built-in exception classes."""


class Records:
    """The judge's records to the worker, batched. The worker reads them once the execution is
    gone, or at a deadline, and sets each test's deadline from the time a record carries, so a
    record held back costs nothing until the judge is about to wait (on the program, or on a
    test's own work): then whatever would move the worker's deadline on by more than HOLD_S goes
    out. A test never loses more than HOLD_S of its time limit."""

    HOLD_S = 0.01

    def __init__(self, rep: Reporter, fd: int):
        self.rep, self.fd = rep, fd
        self.lines: list = []
        self.sent_t = self.last_t = time.monotonic()  # the segment began about when the execution did

    def send(self, payload: dict) -> None:
        self.lines.append(self.rep.line(payload))
        self.last_t = time.monotonic()

    def maybe_flush(self) -> None:
        if self.lines and self.last_t - self.sent_t > self.HOLD_S:
            self.flush()

    def flush(self) -> None:
        if not self.lines:
            return
        view = memoryview(b"".join(self.lines))
        self.lines = []
        self.sent_t = self.last_t
        while view:
            view = view[os.write(self.fd, view) :]


class Channel:
    """The judge's end of one execution: requests out, answers (and callbacks) in."""

    def __init__(self, wr: int, rd: int, budget: int, records: Records):
        self.wr, self.rd, self.budget = wr, wire.Reader(rd), budget
        self.records = records
        self.mine: dict = {}  # the judge's objects the program may call back
        self.buffers: dict = {}  # handle -> [items fetched ahead, pending exception, batch size]
        self.refusal: str | None = None
        # Calls made ahead: (callee id, repr of the encoded arguments (repr tells 1, 1.0 and True
        # apart), answer), the next one last.
        self.planned: list = []
        self.names_phase = False
        self.calls: list = []  # (line, offset, repr) of the program calls made from test code
        self.enc = wire.encoder(self._handle)
        self.dec = wire.decoder(self._remote, self._own, self._module)

    # -- the codec's hooks
    def _handle(self, v):
        if type(v) is Remote:
            if v._c is not self:
                self.refuse("a value of an earlier execution of the program was used")
            return {"x": v._h}
        if not callable(v):
            self.refuse(f"a {type(v).__name__} cannot be passed to the program (not data)")
        self.mine[id(v)] = v
        return {"h": id(v), "n": type(v).__name__}

    def _remote(self, h, name):
        return Remote(self, h, name)

    def _own(self, k):
        try:
            return self.mine[k]
        except KeyError:
            raise wire.WireError("the program named an object the judge never sent") from None

    def _module(self, name, h):
        # Only for the names the test reads from the program ("get"): elsewhere a module the
        # program returns stays a handle, so a program cannot make the judge import things. One
        # the test reads is the judge's own import, never the program's copy (judge_names.py).
        if not self.names_phase:
            return Remote(self, h, "module")
        return import_or_withhold(self, name)

    def refuse(self, why: str):
        if self.refusal is None:
            self.refusal = why
        raise Refused(why)

    # -- requests
    def request(self, msg: dict, args=None) -> dict:
        self.post(msg)
        return self.receive(args)

    def post(self, msg: dict) -> None:
        """Send a request; its answer comes, in order, from ``receive``."""
        if self.planned:
            raise Diverged  # the plan's answers are ahead of this request: the order would change
        try:
            wire.send(self.wr, msg)
        except OSError:
            raise ProgramLost("the program's process ended") from None

    def receive(self, args=None) -> dict:
        self.records.maybe_flush()  # about to wait: the worker must see deadlines move on
        while True:
            try:
                r, n = self.rd.recv(self.budget)
            except wire.WireError as exc:
                if "over the" in str(exc):
                    raise ProgramLost(f"return values over the job's limit ({exc})", "output_limit") from None
                raise ProgramLost(f"the program broke the protocol: {exc}", "error") from None
            except OSError:
                r = None
            if r is None:
                raise ProgramLost("the program ended")
            self.budget -= n
            if type(r) is not dict:
                raise ProgramLost("the program broke the protocol", "error")
            if "cb" in r:
                self._callback(r)
                continue
            if args is not None and type(r.get("w")) is dict:
                self._write_back(args, r["w"])
            return r

    def value(self, r: dict):
        """The value of an answer: decoded data or a handle; the program's exception raised here."""
        if "ok" in r:
            try:
                return self.dec(r["ok"])
            except (wire.WireError, RecursionError, MemoryError) as exc:
                self.refuse(f"the program's value could not be read: {exc}")
        if "exc" in r:
            self._raise(r["exc"])
        if r.get("st") in ("memory", "output_limit"):
            raise Verdict(r["st"], str(r.get("m", ""))[:500])
        self.refuse(str(r.get("bad", "the program sent no value"))[:300])

    def _raise(self, exc):
        name, msg = (exc + ["", ""])[:2] if type(exc) is list else ("", "")
        cls = _EXCEPTIONS.get(name) if type(name) is str else None
        if cls is None:
            raise ProgramError(f"{name}: {msg}")
        if issubclass(cls, (StopIteration, StopAsyncIteration)):
            # Raised from a call inside map() or filter() it would end the test's loop as if every
            # value had been checked (``all(map(check, cases))`` true); a generator makes it a
            # RuntimeError for the same reason (PEP 479). An iterator of the program ends by "next".
            raise RuntimeError(f"the program raised {name}: {msg}")
        raise cls(msg)

    def _write_back(self, args, changed):
        """The program changed a list, dict or set it was passed: change the test's one too."""
        for k, v in changed.items():
            try:
                orig, new = args[int(k)], self.dec(v)
            except (ValueError, IndexError, wire.WireError, RecursionError):
                continue
            if type(orig) is list and type(new) is list:
                orig[:] = new
            elif type(orig) in (dict, set) and type(new) is type(orig):
                orig.clear()
                orig.update(new)

    def _callback(self, r):
        """The program calls one of the judge's objects (a function the test passed it)."""
        try:
            fn = self._own(r["cb"])
            out = fn(*self.dec(r.get("a", [])), **self.dec({"d": r.get("k", [])}))
            reply = {"ok": self.enc(out)}
        except (ProgramLost, Refused):
            raise
        except wire.WireError as exc:
            raise ProgramLost(f"the program broke the protocol: {exc}", "error") from None
        except Exception as exc:  # the test's function raised: the program sees it
            reply = {"exc": [type(exc).__name__, str(exc)[:300]]}
        try:
            wire.send(self.wr, reply)
        except OSError:
            raise ProgramLost("the program's process ended") from None

    def call(self, remote, args, kwargs):
        a = [self.enc(x) for x in args]
        k = [[name, self.enc(v)] for name, v in kwargs.items()]
        if self.planned:  # made ahead: it must be this very call
            cid, sent, reply = self.planned[-1]
            if cid != remote._h or sent != repr([a, k]):
                raise Diverged
            self.planned.pop()
            value = self.value(reply)
        else:
            value = self.value(self.request({"op": "call", "h": remote._h, "a": a, "k": k}, args))
        f = sys._getframe(2)
        while f is not None and not f.f_code.co_filename.startswith("<test "):
            f = f.f_back
        if f is not None:
            self.calls.append((f.f_lineno, f.f_lasti, value))
        return value

    def post_plan(self, plan: list) -> list:
        """Ask the execution to make the test's planned calls now, in one request; returns what
        ``take_plan`` needs once the answer is in."""
        calls = [
            [name, [self.enc(x) for x in args], [[k, self.enc(v)] for k, v in kwargs.items()]]
            for name, args, kwargs in plan
        ]
        self.post({"op": "plan", "calls": calls})
        return calls

    def take_plan(self, calls: list) -> None:
        r = self.receive()
        replies = r.get("plan")
        if type(replies) is not list or len(replies) > len(calls):
            raise ProgramLost("the program broke the protocol", "error")
        made = []
        for (_name, a, k), reply in zip(calls, replies):
            if type(reply) is not dict or "missing" in reply:
                break  # not the program's: the test will find out when it looks the name up
            made.append((reply.get("id"), repr([a, k]), reply))
        self.planned = made[::-1]

    def op(self, remote, op: str, **kw):
        return self.value(self.request(dict(op=op, h=remote._h, **kw)))

    def next_item(self, remote):
        # [items fetched ahead (reversed), the answer that ended the batch early, batch size]
        buf = self.buffers.setdefault(remote._h, [[], None, 1])
        if not buf[0]:
            if buf[1] is not None:
                pending, buf[1] = buf[1], None
                self.value(pending)  # raises the program's exception (or refuses)
            r = self.request({"op": "next", "h": remote._h, "n": buf[2]})
            buf[2] = min(buf[2] * 2, 256)  # fetch ahead more as the loop goes on
            items = self.value({"ok": r["ok"]} if "ok" in r else r)
            if type(items) is not list:
                self.refuse("the program's iterator sent no items")
            buf[0] = items[::-1]
            if any(k in r for k in ("exc", "st", "bad")):
                buf[1] = {k: v for k, v in r.items() if k != "ok"}
            if not buf[0]:
                if buf[1] is not None:
                    pending, buf[1] = buf[1], None
                    self.value(pending)
                raise StopIteration
        return buf[0].pop()


class Remote:
    """An object of the program, held by the execution."""

    __slots__ = ("_c", "_h", "_n")

    def __init__(self, chan: Channel, h: int, name: str):
        self._c, self._h, self._n = chan, h, name

    def __call__(self, *args, **kwargs):
        return self._c.call(self, args, kwargs)

    def __getattr__(self, name):
        if name[:2] == "__":
            raise AttributeError(name)
        return self._c.op(self, "attr", a=name)

    def __iter__(self):
        it = self._c.op(self, "iter")
        if type(it) is not Remote:  # a program cannot hand an iterator over as data: only a handle
            self._c.refuse("the program's iterator is not an iterator")
        return it

    def __next__(self):
        return self._c.next_item(self)

    def _data(self, op, types, what):
        v = self._c.op(self, op)
        if type(v) not in types:
            self._c.refuse(f"the {what} of a {self._n} object of the program is not a {types[0].__name__}")
        return v

    def __len__(self):
        return self._data("len", (int,), "length")

    def __bool__(self):
        return self._data("bool", (bool,), "truth value")

    def __index__(self):
        return self._data("index", (int,), "index")

    def __float__(self):
        return self._data("float", (float,), "float value")

    def __getitem__(self, key):
        return self._c.op(self, "item", k=self._c.enc(key))

    def __contains__(self, item):
        # By iteration, compared here: a program's __contains__ could say yes to everything.
        return any(x is item or x == item for x in self)

    def _compare(self, other):
        self._c.refuse(
            f"the test compared a {self._n} object of the program: only built-in values are "
            "compared (return data: numbers, strings, lists, tuples, dicts, sets ...)"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare
    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self._n} object of the program>"


# ---------------------------------------------------------------------------------------------
# Running tests


def _compiled(source: str):
    """(code or None, names it reads, its plan, why it did not compile, the standard-library
    module names it reads as modules only), cached by source."""
    hit = _COMPILED.get(source)
    if hit is None:
        import ast  # here, not at the worker's start: only the judge needs them

        from . import callplan

        try:
            tree = ast.parse(source, "<test >")  # parsed once, for the code and for the plan
            if tree.body:
                code = compile(tree, "<test >", "exec", dont_inherit=True)
                hit = (code, _names(code), callplan.plan_tree(tree), "", module_names(tree, ast))
            else:  # blank or comments only: it would pass every program that loads, so it is an error
                hit = (None, set(), [], "the test is empty (no statement): it checks nothing", set())
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
            hit = (None, set(), [], f"the test does not compile: {_describe(exc)}", set())
        if len(_COMPILED) >= _MAX_COMPILED:
            _COMPILED.clear()
        _COMPILED[source] = hit
    return hit


def _names(code) -> set:
    out = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            out |= _names(c)
    return out


def run_segment(
    rep: Records, chan: Channel, tests: list, start: int, run_all: bool, seal_key: bytes, plain: bool = False
) -> None:
    compiled = [_compiled(t) for t in tests]
    wanted = set().union(*(c[1] for c in compiled[start:])) - _BUILTIN_NAMES
    # The first test's plan goes out with the request for the names: the execution reads both at
    # once when the program has loaded, and answers one after the other.
    first = compiled[start][2] if start < len(tests) and not plain else ()
    try:
        chan.post({"op": "get", "names": sorted(n for n in wanted if n[:2] != "__")})
        try:
            first_calls = chan.post_plan(first) if first else None
        except ProgramLost:
            # Gone already: a program that did not load answers the first request and leaves,
            # and that answer is still to be read.
            first_calls = None
        r = chan.receive()
        if "load" in r:  # the program failed to load: every remaining test fails with it
            st, msg = (r["load"] + ["error", ""])[:2] if type(r["load"]) is list else ("error", "")
            st = st if st in ("error", "memory", "output_limit") else "error"
            rep.send({"k": "code", "s": st, "m": str(msg)[:500]})
            rep.send({"k": "end"})
            return
        chan.names_phase = True
        try:
            found = chan.value(r)
        finally:
            chan.names_phase = False
        if type(found) is not list or not all(type(x) is list and len(x) == 2 and type(x[0]) is str for x in found):
            chan.refuse("malformed")
        modules = set().union(*(c[4] for c in compiled[start:]))
        found = own_modules(chan, found, modules, (Remote, Withheld))
    except ProgramLost as exc:
        rep.send({"k": "stop", "m": str(exc)})
        return
    except Refused:
        rep.send({"k": "code", "s": "error", "m": "the program's names could not be read"})
        rep.send({"k": "end"})
        return
    now = time.monotonic()
    t = r.get("t")  # when the program finished loading, by the execution's clock (= ours)
    rep.send({"k": "loaded", "t": min(max(t, rep.sent_t), now) if type(t) is float else now})
    g = {"__builtins__": dict(_BUILTINS), "__name__": "__main__"}
    g.update(found)
    for i in range(start, len(tests)):
        rep.maybe_flush()
        chan.refusal, chan.calls, chan.planned = None, [], []
        status, msg = "passed", ""
        try:
            if compiled[i][0] is None:
                raise _TestBroken(compiled[i][3])
            if i == start and first_calls is not None:
                chan.take_plan(first_calls)
            elif compiled[i][2] and not plain:
                chan.take_plan(chan.post_plan(compiled[i][2]))
            exec(compiled[i][0], g)  # the test's own source, run by the judge
        except Diverged:
            rep.send({"k": "fresh", "s": "plain"})  # this test again, in a fresh execution, no plan
            return
        except ProgramLost as exc:
            if exc.status is not None:
                rep.send({"k": "test", "i": i, "s": exc.status, "m": wire.seal(seal_key, i, str(exc)[:500])})
            rep.send({"k": "stop", "m": str(exc)[:500]})
            return
        except AssertionError as exc:
            status, msg = "failed", _assert_message(exc, tests[i], chan)
        except Verdict as exc:
            status, msg = exc.status, str(exc)
        except MemoryError as exc:
            status, msg = "memory", f"the test's own evaluation ran out of memory: {_describe(exc)}"
        except (Refused, _TestBroken) as exc:
            status, msg = "error", str(exc)
        except BaseException as exc:  # the test raised (as the program made it)
            status, msg = "error", _describe(exc)
        if chan.refusal is not None:  # refused even if the test caught it
            status, msg = "error", chan.refusal[:500]
        rep.send({"k": "test", "i": i, "s": status, "m": wire.seal(seal_key, i, msg) if msg else ""})
        if status != "passed" and not run_all:
            break
        if chan.planned and i + 1 < len(tests):
            # Calls made ahead that the test never took: the program's state is not what the
            # next test would find after this one. It starts in a fresh execution.
            rep.send({"k": "fresh", "s": ""})
            return
    rep.send({"k": "end"})


def main(sock_fd: int) -> None:
    """The judge's loop (in the forked judge). Never returns."""
    import gc
    import socket

    gc.enable()  # the worker runs without automatic collection; tests may make cycles
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)  # a test's prints go nowhere
    sock = socket.socket(fileno=sock_fd)
    tests: list = []
    seal_key = b""
    base_as = _address_space()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 4, 2)
        except OSError:
            os._exit(0)
        if len(data) < 4:
            os._exit(0)
        n = int.from_bytes(data, "big")
        hdr = json.loads(_read_exact(sock, n))
        if hdr.get("secret"):
            job = json.loads(_read_exact(sock, hdr["secret"]).decode("utf-8", "surrogatepass"))
            tests, seal_key = job["t"], bytes.fromhex(job["k"])
            # Each job gets its memory_mb on top of what the judge holds when it starts: memory an
            # earlier job's values left mapped (freed, kept by the allocators) is not charged to it.
            base_as = _address_space()
        if len(fds) != 2:
            os._exit(70)
        try:
            lim = base_as + (int(hdr["memory_mb"]) << 20)
            resource.setrlimit(resource.RLIMIT_AS, (lim, resource.RLIM_INFINITY))
        except (ValueError, OSError):
            pass
        rep = Records(Reporter(sock_fd, bytes.fromhex(hdr["key"])), sock_fd)
        chan = Channel(fds[0], fds[1], int(hdr["budget"]), rep)
        try:
            run_segment(
                rep, chan, tests, int(hdr["start"]), bool(hdr["run_all_cases"]), seal_key, bool(hdr.get("plain"))
            )
            # The records first: the worker reads them once the execution is gone, which closing
            # the channel brings about, so they are there when it wakes.
            rep.flush()
            for fd in fds:
                os.close(fd)
        except (OSError, MemoryError):
            os._exit(70)  # the worker sees the judge go and replaces it
        del chan, rep
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _read_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        b = sock.recv(min(n - len(buf), 1 << 20))
        if not b:
            os._exit(0)
        buf += b
    return bytes(buf)


def _address_space() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
