"""The solution's side of a judge round (:mod:`._judge`): the proxies that stand for its
functions, the answers they replay, the placeholders of discovery, and the judge's signals.

A proxy call is encoded to the wire form and named by a hash of it; its record (the executor's
answer) is decoded into a fresh plain value, or raised as what the solution raised. Whatever
decides a statement's outcome here (an answer that times out, crashes, cannot be read or sent)
is written into the round's record (:meth:`_State.note`) before the signal is raised, so that a
test that catches the signal changes nothing.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import reprlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from areal_agents.rewards._wire import Unsendable, decode, dumps, encode

__all__ = ["Call", "CandidateError", "safe_str"]

_PENDING_OPS = 100_000
_MAX_NEW_CALLS = 5_000


@dataclass(frozen=True)
class Call:
    """One request for the executor: ``op`` is ``call`` or ``get`` (a top-level value)."""

    key: str
    op: str
    name: str
    args: Any
    kwargs: Any


class _Signal(BaseException):
    """The judge's own control flow. Its meaning is recorded before it is raised (see the
    module docstring), so that catching it changes nothing."""


class _Unknown(_Signal):
    """Stops a statement that needs an answer not known yet."""


class _CaseFailed(_Signal):
    """A call's answer fails the statement whatever the tests do with it."""


class _CallTimeout(_Signal):
    """The solution ran out of time in a call (in the sandbox)."""


class _Crashed(_Signal):
    """The solution ended the executor during a call."""


class _JudgeTimeout(_Signal):
    """The test code itself ran past the case limit on the host."""


class CandidateError(Exception):
    """An exception the solution raised whose type is not a built-in one."""


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 300
_REPR.maxlevel = 4


def safe_str(value: Any, limit: int = 300) -> str:
    """``str(value)`` (``repr`` of a container) that never raises and is valid UTF-8: a huge
    int, a failing ``__str__`` or a deep value becomes ``<type>``; lone surrogates are
    escaped; at most ``limit`` characters."""
    try:
        if type(value) is str:
            text = value
        elif type(value) is int and value.bit_length() > 10_000:
            text = f"<an int of {value.bit_length()} bits>"
        elif isinstance(value, BaseException):
            text = str(value)
        else:
            text = _REPR.repr(value)
        if type(text) is not str:
            raise TypeError
    except BaseException:
        try:
            text = f"<{type(value).__name__}>"
        except BaseException:
            text = "<?>"
    return text[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(error: BaseException) -> str:
    if isinstance(error, _Signal):
        return safe_str(error, 500)
    return f"{safe_str(type(error).__name__, 100)}: {safe_str(error, 400)}"


class _State:
    def __init__(self, answers: dict[str, str], discovery: bool) -> None:
        self.answers = answers
        self.discovery = discovery
        self.dirty = False  # an unknown call happened: nothing after it counts
        self.ops = 0
        self.new: dict[str, Call] = {}
        self.events: list[tuple[str, str]] = []  # final failures, recorded out of band
        self.interactions = 0  # calls and value reads of the solution
        self.checks = 0  # asserts and unittest tests that ran

    def note(self, kind: str, message: str) -> None:
        """Record a final failure (``fail``, ``timeout``, ``crash``) unless nothing counts."""
        if not self.dirty:
            self.events.append((kind, message))

    def signal(self, kind: str, message: str, cls: type[_Signal]) -> _Signal:
        self.note(kind, message)
        return cls(message)

    def want(self, call: Call) -> Any:
        self.dirty = True
        self.ops += 1
        if len(self.new) >= _MAX_NEW_CALLS or self.ops > _PENDING_OPS:
            raise _Unknown()
        self.new.setdefault(call.key, call)
        if not self.discovery:
            raise _Unknown()
        return _Pending(self)

    def record(self, key: str) -> dict[str, Any] | None:
        text = self.answers.get(key)
        if text is None:
            return None
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict):
            raise self.signal(
                "fail", "the sandbox's answer to a call could not be read", _CaseFailed
            )
        return record

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.interactions += 1
        try:
            args_form = encode(list(args))
            kwargs_form = encode(dict(sorted(kwargs.items())))
        except Unsendable as e:
            if self.dirty:
                raise _Unknown() from None
            message = f"the tests call {name} with {safe_str(e)}, which cannot be sent"
            raise self.signal("fail", message, _CaseFailed) from None
        key = _key("call", name, args_form, kwargs_form)
        record = self.record(key)
        if record is None:
            return self.want(Call(key, "call", name, args_form, kwargs_form))
        value = _outcome(self, name, record)
        changed = record.get("args")
        if isinstance(changed, dict):
            for slot, form in changed.items():
                if isinstance(slot, str) and slot.startswith("k"):
                    _update(kwargs.get(slot[1:]), form)
                elif isinstance(slot, str) and slot.isdigit() and int(slot) < len(args):
                    _update(args[int(slot)], form)
        return value

    def get(self, name: str) -> Any:
        self.interactions += 1
        key = _key("get", name, None, None)
        record = self.record(key)
        if record is None:
            return self.want(Call(key, "get", name, None, None))
        if record.get("callable") is True:
            return _Proxy(name, self)
        return _outcome(self, name, record)


def _key(*parts: Any) -> str:
    return hashlib.sha256(dumps(list(parts)).encode()).hexdigest()[:24]


def _outcome(state: _State, name: str, record: dict[str, Any]) -> Any:
    if "ok" in record:
        try:
            return decode(record["ok"])
        except (ValueError, TypeError, RecursionError, OverflowError, MemoryError) as e:
            message = f"the answer of {name} could not be read: {safe_str(e)}"
            raise state.signal("fail", message, _CaseFailed) from None
    if record.get("timeout") is True:
        raise state.signal("timeout", f"{name} timed out", _CallTimeout)
    if "crashed" in record:
        raise state.signal("crash", f"{name}: {safe_str(record['crashed'])}", _Crashed)
    raised = record.get("raised")
    if isinstance(raised, list) and len(raised) == 2 and all(isinstance(s, str) for s in raised):
        kind, message = safe_str(raised[0], 100), safe_str(raised[1], 500)
        cls = getattr(builtins, kind, None) if kind.isidentifier() else None
        if cls in (StopIteration, StopAsyncIteration):  # would end the tests' loops quietly
            raise CandidateError(f"{kind}: {message}")
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                error = cls(message)
            except Exception:
                error = CandidateError(f"{kind}: {message}")
            raise error
        if isinstance(cls, type) and issubclass(cls, BaseException):
            raise state.signal("fail", f"{name} raised {kind}: {message}", _CaseFailed)
        raise CandidateError(f"{kind}: {message}")
    if "unsendable" in record:
        reason = safe_str(record["unsendable"])
        message = (
            f"{name} returned {reason}, which cannot leave the sandbox (only None, bool, int, "
            "float, complex, str, bytes, list, tuple, dict, set and frozenset do; classes and "
            "other objects are not supported)"
        )
        raise state.signal("fail", message, _CaseFailed)
    message = f"{name}: {safe_str(record.get('lost', 'no answer'))}"
    raise state.signal("fail", message, _CaseFailed)


def _update(target: Any, form: Any) -> None:
    """Apply a change the solution made to an argument in place (lists, dicts, sets)."""
    try:
        new = decode(form)
    except (ValueError, TypeError, RecursionError, OverflowError, MemoryError):
        return
    if type(target) is list and type(new) is list:
        target[:] = new
    elif (type(target) is dict and type(new) is dict) or (type(target) is set and type(new) is set):
        target.clear()
        target.update(new)


class _Proxy:
    """Stands for a function of the solution; calling it asks the sandbox (through answers)."""

    __slots__ = ("_name", "_state")

    def __init__(self, name: str, state: _State) -> None:
        self._name = name
        self._state = state

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._state.call(self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<solution function {self._name}>"


class _Pending:
    """The placeholder for an answer not known yet (see the module docstring)."""

    __slots__ = ("_state",)

    def __init__(self, state: _State) -> None:
        self._state = state

    def _tick(self) -> None:
        self._state.ops += 1
        if self._state.ops > _PENDING_OPS:
            raise _Unknown()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._tick()
        return self


def _same(self: _Pending, *args: Any, **kwargs: Any) -> _Pending:
    self._tick()
    return self


def _constant(value: Any) -> Any:
    def method(self: _Pending, *args: Any) -> Any:
        self._tick()
        return value

    return method


_SAME = "add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod rmod pow rpow neg pos"
_SAME += " abs invert and rand or ror xor rxor lshift rlshift rshift rrshift getitem call round"
for _name in [*_SAME.split(), "floor", "ceil", "trunc", "matmul", "rmatmul"]:
    setattr(_Pending, f"__{_name}__", _same)
for _name, _value in {
    "eq": True, "ne": False, "lt": True, "le": True, "gt": True, "ge": True, "bool": True,
    "contains": True, "len": 0, "index": 0, "int": 0, "float": 0.0, "complex": 0j, "hash": 0,
    "str": "", "repr": "<pending>", "format": "",
}.items():  # fmt: skip
    setattr(_Pending, f"__{_name}__", _constant(_value))


def _empty(self: _Pending) -> Iterator[Any]:
    self._tick()
    return iter(())


setattr(_Pending, "__iter__", _empty)  # noqa: B010
