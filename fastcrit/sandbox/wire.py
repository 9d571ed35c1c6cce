"""Values crossing between an execution and its judge (harness.serve and judge.py).

Both sides speak length-prefixed JSON frames over two pipes. A value crosses as data: ``None``,
``bool``, ``int``, ``float`` and ``str`` as themselves, lists as lists, and everything else as a
one-key tagged dict:

    {"t": [...]} tuple     {"s": [...]} set        {"f": [...]} frozenset   {"d": [[k, v], ...]} dict
    {"c": [re, im]} complex {"b": hex} bytes        {"ba": hex} bytearray    {"r": [a, b, c]} range
    {"q": [...]} deque     {"od": [[k, v]]} OrderedDict                     {"cn": [[k, v]]} Counter
    {"fr": [n, d]} Fraction                         {"dec": text} Decimal    {"n": hex} a big int
    {"h": id, "n": type name}   an object that is not data, held by the sender (a handle)
    {"x": id}                   one of the receiver's own handles, sent back to it
    {"m": module name, "h": id} a module (the judge uses its own import of that name)

The receiver rebuilds data with its own classes, so no object of the other side survives the
crossing: a program's ``__eq__`` cannot be asked by the judge, and whatever the program's values
claim, they are only the program's answer. Subclasses of built-in data (a namedtuple, an IntEnum,
a dict subclass) are sent as their built-in base, read through the base type. Anything else is a
handle: the judge may call it, read its attributes, iterate over it, take its length or an item,
but never compare it (judge.Remote).
"""

from __future__ import annotations

import json
import os
import struct

_HDR = struct.Struct(">I")
MAX_DEPTH = 100
# Integers Python writes in decimal only up to 4300 digits (sys.get_int_max_str_digits): bigger
# ones (a factorial of 2000 has 5736) cross in hexadecimal, which has no such limit.
_BIG = 1 << 4096
_type, _len = type, len
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=True).encode
_scan = json.JSONDecoder().scan_once  # the C scanner, without loads' encoding and whitespace checks


def _loads(body: bytes):
    text = body.decode("utf-8")
    try:
        value, end = _scan(text, 0)
    except StopIteration as exc:
        raise ValueError(f"not JSON at character {exc.value}") from None
    if end != _len(text):
        raise ValueError("extra data after the value")
    return value


class WireError(Exception):
    """A frame or a value that does not follow the protocol (or is over the size limit)."""


def dumps(obj) -> bytes:
    return _dumps(obj).encode("utf-8", "surrogatepass")


def send(fd: int, obj) -> None:
    send_body(fd, dumps(obj))


def send_body(fd: int, body: bytes) -> None:
    view = memoryview(_HDR.pack(_len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


class Reader:
    """Frames from one fd, read in big pieces (one read usually holds a whole frame, often more)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()

    def recv(self, limit: int):
        """The next frame's value and its size in bytes, or (None, 0) at end of file. A frame over
        ``limit`` bytes raises WireError before its body is read."""
        buf = self.buf
        while _len(buf) < 4:
            if not self._more():
                return None, 0
        (n,) = _HDR.unpack_from(buf)
        if n > limit:
            raise WireError(f"a message of {n} bytes, over the {limit} bytes left")
        while _len(buf) < 4 + n:
            if not self._more():
                return None, 0
        body = bytes(buf[4 : 4 + n])
        del buf[: 4 + n]
        try:
            return _loads(body), n + 4
        except (ValueError, RecursionError) as exc:
            raise WireError(f"unreadable message: {exc}") from None

    def _more(self) -> bool:
        b = os.read(self.fd, 1 << 16)
        if not b:
            return False
        self.buf += b
        return True


# ---------------------------------------------------------------------------------------------
# Encoding (either side)

_NAMED = {}  # (module, qualname) of library types sent as data -> encoder


def _pairs(items, enc, depth):
    return [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in items]


def encoder(handle):
    """An encoder whose non-data values become ``handle(value)`` (a tagged dict)."""

    def enc(v, depth=0):
        if depth > MAX_DEPTH:
            raise WireError("value nested more than 100 deep")
        t = _type(v)
        if v is None or t is bool or t is str or t is float:
            return v
        if t is int:
            return v if -_BIG < v < _BIG else {"n": hex(v)}
        if t is list:
            return [enc(x, depth + 1) for x in v]
        if t is tuple:
            return {"t": [enc(x, depth + 1) for x in v]}
        if t is dict:
            return {"d": _pairs(dict.items(v), enc, depth)}
        if t is set or t is frozenset:
            return {"s" if t is set else "f": [enc(x, depth + 1) for x in v]}
        if t is complex:
            return {"c": [v.real, v.imag]}
        if t is bytes:
            return {"b": v.hex()}
        if t is bytearray:
            return {"ba": v.hex()}
        if t is range:
            return {"r": [v.start, v.stop, v.step]}
        named = _NAMED.get((getattr(t, "__module__", None), getattr(t, "__qualname__", None)))
        if named is not None:
            return named(v, enc, depth)
        # Subclasses of built-in data, as their base (read through the base type's own methods).
        if isinstance(v, int):
            return enc(int.__index__(v), depth) if not isinstance(v, bool) else bool(v)
        if isinstance(v, float):
            return float.__float__(v)
        if isinstance(v, str):
            return str.__str__(v)
        if isinstance(v, tuple):
            return {"t": [enc(x, depth + 1) for x in tuple.__iter__(v)]}
        if isinstance(v, list):
            return [enc(x, depth + 1) for x in list.__iter__(v)]
        if isinstance(v, dict):
            return {"d": _pairs(dict.items(v), enc, depth)}
        if isinstance(v, frozenset):
            return {"f": [enc(x, depth + 1) for x in frozenset.__iter__(v)]}
        if isinstance(v, set):
            return {"s": [enc(x, depth + 1) for x in set.__iter__(v)]}
        if getattr(t, "__module__", "") == "numpy" and hasattr(v, "tolist"):
            return enc(v.tolist(), depth)  # numpy arrays and scalars: their values as lists / numbers
        return handle(v)

    return enc


_NAMED[("collections", "deque")] = lambda v, enc, d: {"q": [enc(x, d + 1) for x in v]}
_NAMED[("collections", "OrderedDict")] = lambda v, enc, d: {"od": _pairs(dict.items(v), enc, d)}
_NAMED[("collections", "Counter")] = lambda v, enc, d: {"cn": _pairs(dict.items(v), enc, d)}
_NAMED[("collections", "defaultdict")] = lambda v, enc, d: {"d": _pairs(dict.items(v), enc, d)}
_NAMED[("fractions", "Fraction")] = lambda v, enc, d: {
    "fr": [enc(int(v.numerator), d + 1), enc(int(v.denominator), d + 1)]
}
_NAMED[("decimal", "Decimal")] = lambda v, enc, d: {"dec": str(v)}


# ---------------------------------------------------------------------------------------------
# Decoding (either side): built-in objects only, or the handles the callbacks make


def decoder(remote, own, module=None):
    """A decoder: ``remote(id, type name)`` makes the proxy of the sender's object, ``own(id)``
    returns one of the receiver's handles, ``module(name, id)`` a module ("m")."""

    def dec(o, depth=0):
        if depth > MAX_DEPTH:
            raise WireError("value nested more than 100 deep")
        t = _type(o)
        if o is None or t is bool or t is int or t is str or t is float:
            return o
        if t is list:
            return [dec(x, depth + 1) for x in o]
        if t is not dict or not o:
            raise WireError(f"malformed value of type {t.__name__}")
        if "h" in o:
            h = o["h"]
            if _type(h) is not int:
                raise WireError("malformed handle")
            if "m" in o and module is not None and _type(o["m"]) is str:
                return module(o["m"], h)
            return remote(h, str(o.get("n", "object"))[:100])
        if _len(o) != 1:
            raise WireError("malformed tagged value")
        ((tag, body),) = o.items()
        try:
            return _TAGS[tag](body, dec, depth, own)
        except KeyError:
            raise WireError(f"unknown tag {tag!r}") from None
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise WireError(f"malformed {tag!r} value: {exc}") from None

    return dec


def _seq(body, dec, depth):
    if _type(body) is not list:
        raise TypeError("not a list")
    return [dec(x, depth + 1) for x in body]


def _kv(body, dec, depth):
    out = []
    for kv in _seq(body, dec, depth):
        if _type(kv) is not list or _len(kv) != 2:
            raise TypeError("not a [key, value] pair")
        out.append(kv)
    return out


def _num_pair(body):
    if _type(body) is not list or _len(body) != 2 or not all(_type(x) in (int, float) for x in body):
        raise TypeError("not a pair of numbers")
    return body


def _ints(body, n):
    if _type(body) is not list or _len(body) != n or not all(_type(x) is int for x in body):
        raise TypeError(f"not {n} integers")
    return body


def _own(body, own):
    if _type(body) is not int:
        raise TypeError("not an id")
    return own(body)


def _bad_big():
    raise TypeError("not a hexadecimal integer")


def _lib(module, name):
    import importlib

    return getattr(importlib.import_module(module), name)


_TAGS = {
    "t": lambda b, dec, d, own: tuple(_seq(b, dec, d)),
    "s": lambda b, dec, d, own: set(_seq(b, dec, d)),
    "f": lambda b, dec, d, own: frozenset(_seq(b, dec, d)),
    "d": lambda b, dec, d, own: dict(_kv(b, dec, d)),
    "c": lambda b, dec, d, own: complex(*_num_pair(b)),
    "b": lambda b, dec, d, own: bytes.fromhex(b),
    "ba": lambda b, dec, d, own: bytearray.fromhex(b),
    "r": lambda b, dec, d, own: range(*_ints(b, 3)),
    "q": lambda b, dec, d, own: _lib("collections", "deque")(_seq(b, dec, d)),
    "od": lambda b, dec, d, own: _lib("collections", "OrderedDict")(_kv(b, dec, d)),
    "cn": lambda b, dec, d, own: _lib("collections", "Counter")(dict(_kv(b, dec, d))),
    "fr": lambda b, dec, d, own: _lib("fractions", "Fraction")(*_ints(_seq(b, dec, d), 2)),
    "n": lambda b, dec, d, own: int(b, 16) if _type(b) is str and _len(b) < (1 << 24) else _bad_big(),
    "dec": lambda b, dec, d, own: _lib("decimal", "Decimal")(b if _type(b) is str else None),
    "x": lambda b, dec, d, own: _own(b, own),
}


# ---------------------------------------------------------------------------------------------
# Sealed messages: a failed test's message quotes the test (``assert f(3) == 9``), and the worker
# that carries it to the pool forks later executions, which could find it in the worker's freed
# memory. So the judge seals it with a key that only the pool and the judge hold (it travels with
# the tests, which the worker relays unread): the worker only ever holds the sealed text.

SEALED = "sealed:"


def _keystream(key: bytes, index: int, n: int) -> bytes:
    try:
        from _blake2 import blake2b
    except ImportError:  # pragma: no cover
        from hashlib import blake2b
    out = bytearray()
    block = 0
    while _len(out) < n:
        out += blake2b(b"%d:%d" % (index, block), key=key, digest_size=64).digest()
        block += 1
    return bytes(out[:n])


def seal(key: bytes, index: int, text: str) -> str:
    data = text.encode("utf-8", "replace")
    ks = _keystream(key, index, _len(data))
    return SEALED + bytes(a ^ b for a, b in zip(data, ks)).hex()


def unseal(key: bytes, index: int, text: str) -> str:
    if not text.startswith(SEALED):
        return text
    try:
        data = bytes.fromhex(text[_len(SEALED) :])
    except ValueError:
        return "(a message the sandbox could not read)"
    ks = _keystream(key, index, _len(data))
    return bytes(a ^ b for a, b in zip(data, ks)).decode("utf-8", "replace")
