"""The tagged, type-strict JSON form of the values that cross the sandbox wall.

Shared by the judge (host) and the executor (inside the sandbox), so it uses nothing but the
standard library and defines nothing that the executor's source could not carry: this file's
text is sent into the sandbox ahead of :mod:`areal_agents.rewards._executor`.

Only these exact types travel (``type(x) is int``, never a subclass): ``None``, ``bool``,
``int``, ``float`` (``nan`` and ``inf`` included), ``complex``, ``str``, ``bytes``, ``list``,
``tuple``, ``dict``, ``set`` and ``frozenset``. Any other object cannot be encoded
(:class:`Unsendable`), so whatever the program under test returns reaches the judge as a plain
value built by :func:`decode` on the host, never as an object of the program's making.

Form: ``None``, ``bool`` and ``str`` are themselves; an ``int`` is a JSON integer when small,
else ``["i", hex]``; the others are a tag and a payload: ``["f", float.hex]``,
``["c", re, im]``, ``["b", hex]``, ``["l", [...]]``, ``["t", [...]]``, ``["d", [[k, v], ...]]``,
``["s", [...]]`` and ``["F", [...]]`` (set elements sorted by their JSON text, so that equal
sets encode alike). Nesting is capped at :data:`MAX_DEPTH` and the number of items at
:data:`MAX_ITEMS` in both directions; :func:`decode` refuses anything malformed with
``ValueError`` and never recurses past the cap.

>>> decode(encode({"a": [1, 2.5, (None, b"x")], 3: {frozenset({1})}}))
{'a': [1, 2.5, (None, b'x')], 3: {frozenset({1})}}
>>> encode(True), encode(2**70)
(True, ['i', '0x400000000000000000'])
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_ITEMS", "Unsendable", "decode", "dumps", "encode"]

#: Deepest nesting of containers that travels.
MAX_DEPTH = 100
#: Most items (every element, key and value counted) in one value.
MAX_ITEMS = 1_000_000
_SMALL = 2**53


class Unsendable(Exception):
    """A value that has no wire form (its type, its depth or its size)."""


def dumps(form: Any) -> str:
    """The JSON text of an encoded form (ASCII only, no spaces)."""
    return json.dumps(form, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def encode(value: Any) -> Any:
    """The wire form of ``value``; :class:`Unsendable` when it has none."""
    count = [0]
    return _encode(value, 0, count)


def _encode(x: Any, depth: int, count: list[int]) -> Any:
    count[0] += 1
    if count[0] > MAX_ITEMS:
        raise Unsendable(f"more than {MAX_ITEMS} items")
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return x if -_SMALL < x < _SMALL else ["i", hex(x)]
    if t is float:
        return ["f", float.hex(x)]
    if t is complex:
        return ["c", float.hex(x.real), float.hex(x.imag)]
    if t is bytes:
        return ["b", x.hex()]
    if depth >= MAX_DEPTH:
        raise Unsendable(f"nested deeper than {MAX_DEPTH} levels")
    if t is list or t is tuple:
        items = [_encode(v, depth + 1, count) for v in x]
        return ["l" if t is list else "t", items]
    if t is dict:
        pairs = [
            [_encode(k, depth + 1, count), _encode(v, depth + 1, count)] for k, v in dict.items(x)
        ]
        return ["d", pairs]
    if t is set or t is frozenset:
        forms = [_encode(v, depth + 1, count) for v in list(x)]
        forms.sort(key=dumps)
        return ["s" if t is set else "F", forms]
    raise Unsendable(f"a value of type {_type_name(x)}")


def _type_name(x: Any) -> str:
    t = type(x)
    module, name = type.__dict__["__module__"].__get__(t), type.__dict__["__name__"].__get__(t)
    if type(module) is not str or type(name) is not str:
        return "?"
    return name if module == "builtins" else f"{module}.{name}"


def decode(form: Any) -> Any:
    """The value of a wire form (fresh objects every time); ``ValueError`` when malformed."""
    count = [0]
    return _decode(form, 0, count)


def _float(text: Any) -> float:
    if type(text) is not str or len(text) > 40:
        raise ValueError("a float is not a hex string")
    return float.fromhex(text)


def _decode(f: Any, depth: int, count: list[int]) -> Any:
    count[0] += 1
    if count[0] > MAX_ITEMS:
        raise ValueError(f"more than {MAX_ITEMS} items")
    t = type(f)
    if f is None or t is bool or t is str:
        return f
    if t is int:
        return f
    if t is not list or not f or type(f[0]) is not str:
        raise ValueError(f"not a wire form: {t.__name__}")
    tag = f[0]
    if tag == "i" and len(f) == 2 and type(f[1]) is str:
        return int(f[1], 16)
    if tag == "f" and len(f) == 2:
        return _float(f[1])
    if tag == "c" and len(f) == 3:
        return complex(_float(f[1]), _float(f[2]))
    if tag == "b" and len(f) == 2 and type(f[1]) is str:
        return bytes.fromhex(f[1])
    if len(f) != 2 or type(f[1]) is not list:
        raise ValueError(f"malformed wire form with tag {tag[:10]!r}")
    if depth >= MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    items = f[1]
    if tag == "l":
        return [_decode(v, depth + 1, count) for v in items]
    if tag == "t":
        return tuple(_decode(v, depth + 1, count) for v in items)
    if tag == "d":
        out = {}
        for pair in items:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("a dict item is not a pair")
            key = _decode(pair[0], depth + 1, count)
            try:
                out[key] = _decode(pair[1], depth + 1, count)
            except TypeError:
                raise ValueError("a dict key is not hashable") from None
        return out
    if tag == "s" or tag == "F":
        elements = [_decode(v, depth + 1, count) for v in items]
        try:
            return set(elements) if tag == "s" else frozenset(elements)
        except TypeError:
            raise ValueError("a set element is not hashable") from None
    raise ValueError(f"unknown wire tag {tag[:10]!r}")
