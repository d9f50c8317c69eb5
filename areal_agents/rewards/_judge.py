"""The judge: the hidden tests, run on the host against a solution that stays in the sandbox.

One :func:`judge_round` runs in a killable grading process (:func:`~areal_agents.rewards.
isolation.run_isolated`). It executes the trusted code (the task's preamble, then the tests)
with the solution's names bound to proxies. A proxy call whose answer is known (``answers``,
the executor's records by call id) returns a fresh plain value decoded from the wire form, or
raises what the solution raised; a call not known yet is recorded for the next sandbox run.
The caller repeats rounds until one needs no unknown call: that round's outcomes are the
verdict (:mod:`areal_agents.rewards.code` has the loop).

Discovery: so that one round finds a whole loop's worth of calls (``for x in xs: assert
f(x) == g(x)``), an unknown call returns a *pending* placeholder that says yes to comparisons
and no-ops through arithmetic. Nothing a round computes with a placeholder counts: a case is
only final when it ran before any unknown call of its round. Test code that loops for ever on
placeholders runs out of its operation budget (or the round's time, after which the caller
runs strict rounds, where an unknown call stops its case at once).

Every random draw of the tests is made reproducible (``random`` is seeded the same before each
round), so that the calls of one round are the calls of the next.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import importlib
import io
import json
import random
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from areal_agents.rewards._cases import (
    compile_tests,
    preamble_code,
    referenced,
    solution_names,
    split,
)
from areal_agents.rewards._wire import Unsendable, decode, dumps, encode

__all__ = ["Call", "JudgeSpec", "Round", "judge_round"]

_PENDING_OPS = 100_000
_MAX_NEW_CALLS = 5_000


@dataclass(frozen=True)
class JudgeSpec:
    """What a round needs: the tests (as in :class:`~areal_agents.rewards.UnitTests`), the
    solution's source (only parsed here, for its top-level names) and the limits."""

    tests: tuple[str, ...] | str
    mode: str
    entry_point: str | None
    preamble: str
    solution: str
    case_timeout_s: float
    fail_fast: bool


@dataclass(frozen=True)
class Call:
    """One request for the executor: ``op`` is ``call`` or ``get`` (a top-level value)."""

    key: str
    op: str
    name: str
    args: Any
    kwargs: Any


@dataclass(frozen=True)
class Round:
    """The outcome of one round. ``decided``: the verdict is known (every case is final, or a
    final failure under ``fail_fast``); otherwise ``calls`` are needed first."""

    decided: bool
    total: int
    passed: int
    case_timeouts: int
    failures: tuple[str, ...]
    crashed: str | None
    setup_error: str | None  # the test program failed to run (HumanEval's check)
    calls: tuple[Call, ...]


class _Unknown(BaseException):
    """Stops a case that needs an answer not known yet."""


class _CaseFailed(BaseException):
    """A failure the test code must not catch (it says why the case failed)."""


class _CallTimeout(BaseException):
    """The solution ran out of time in a call (in the sandbox)."""


class _Crashed(BaseException):
    """The solution ended the executor during a call."""


class _JudgeTimeout(BaseException):
    """The test code itself ran past the case limit on the host."""


class CandidateError(Exception):
    """An exception the solution raised whose type is not a built-in one."""


class _State:
    def __init__(self, answers: dict[str, str], discovery: bool) -> None:
        self.answers = answers
        self.discovery = discovery
        self.dirty = False
        self.ops = 0
        self.new: dict[str, Call] = {}

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
            raise _CaseFailed("the sandbox's answer to a call could not be read")
        return record

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            args_form = encode(list(args))
            kwargs_form = encode(dict(sorted(kwargs.items())))
        except Unsendable as e:
            if self.dirty:
                raise _Unknown() from None
            raise _CaseFailed(f"the tests call {name} with {e}, which cannot be sent") from None
        key = _key("call", name, args_form, kwargs_form)
        record = self.record(key)
        if record is None:
            return self.want(Call(key, "call", name, args_form, kwargs_form))
        value = _outcome(name, record)
        changed = record.get("args")
        if isinstance(changed, dict):
            for slot, form in changed.items():
                if isinstance(slot, str) and slot.startswith("k"):
                    _update(kwargs.get(slot[1:]), form)
                elif isinstance(slot, str) and slot.isdigit() and int(slot) < len(args):
                    _update(args[int(slot)], form)
        return value

    def get(self, name: str) -> Any:
        key = _key("get", name, None, None)
        record = self.record(key)
        if record is None:
            return self.want(Call(key, "get", name, None, None))
        if record.get("callable") is True:
            return _Proxy(name, self)
        return _outcome(name, record)


def _key(*parts: Any) -> str:
    return hashlib.sha256(dumps(list(parts)).encode()).hexdigest()[:24]


def _outcome(name: str, record: dict[str, Any]) -> Any:
    if "ok" in record:
        try:
            return decode(record["ok"])
        except (ValueError, TypeError, RecursionError, OverflowError) as e:
            raise _CaseFailed(f"the answer of {name} could not be read: {e}") from None
    if record.get("timeout") is True:
        raise _CallTimeout(f"{name} timed out")
    if "crashed" in record:
        raise _Crashed(f"{name}: {str(record['crashed'])[:300]}")
    raised = record.get("raised")
    if isinstance(raised, list) and len(raised) == 2 and all(isinstance(s, str) for s in raised):
        kind, message = raised
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
            raise _CaseFailed(f"{name} raised {kind}: {message}")
        raise CandidateError(f"{kind}: {message}")
    if "unsendable" in record:
        reason = str(record["unsendable"])[:300]
        raise _CaseFailed(
            f"{name} returned {reason}, which cannot leave the sandbox (only None, bool, int, "
            "float, complex, str, bytes, list, tuple, dict, set and frozenset do; classes and "
            "other objects are not supported)"
        )
    raise _CaseFailed(f"{name}: {str(record.get('lost', 'no answer'))[:300]}")


def _update(target: Any, form: Any) -> None:
    """Apply a change the solution made to an argument in place (lists, dicts, sets)."""
    try:
        new = decode(form)
    except (ValueError, TypeError, RecursionError, OverflowError):
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


def _alarm(signum: int, frame: Any) -> None:
    raise _JudgeTimeout()


@contextlib.contextmanager
def _limit(seconds: float) -> Iterator[None]:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _describe(error: BaseException) -> str:
    if isinstance(error, _CaseFailed | _Crashed | _CallTimeout):
        return str(error)[:500]
    return f"{type(error).__name__}: {error}"[:500]


# ---- one round -----------------------------------------------------------------------------


def judge_round(spec: JudgeSpec, answers: dict[str, str], discovery: bool) -> Round:
    """Run the tests once against ``answers`` (see the module docstring)."""
    saved = random.getstate()
    random.seed(0x5EED)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return _round(spec, _State(answers, discovery))
    finally:
        random.setstate(saved)


def _round(spec: JudgeSpec, state: _State) -> Round:
    namespace: dict[str, Any] = {"__name__": "__areal_tests__", "__builtins__": builtins}
    limit = spec.case_timeout_s

    def run(code: Any) -> tuple[str, str | None]:
        try:
            with _limit(limit):
                exec(code, namespace)
        except _Unknown:
            return "unknown", None
        except (_CallTimeout, _JudgeTimeout) as e:
            return "timeout", str(e) or f"the tests ran past {limit:g} s"
        except _Crashed as e:
            return "crash", str(e)
        except BaseException as e:
            return "fail", _describe(e)
        return "ok", None

    def fail(message: Any = None) -> None:
        if not state.dirty:
            raise AssertionError() if message is None else AssertionError(message)

    namespace["__areal_fail__"] = fail
    preamble = preamble_code(spec.preamble) if spec.preamble.strip() else None
    if preamble is not None:
        run(preamble)
    entry = spec.entry_point
    if spec.mode == "check":
        bind: dict[str, str] = {entry: "function"} if entry else {}
    else:
        sources = [spec.tests] if isinstance(spec.tests, str) else list(spec.tests)
        wanted = referenced(sources)
        functions, values, modules = solution_names(spec.solution)
        # never a name the preamble defines or a builtin: `def abs(x): return 0` must not
        # change what the tests' own `abs(f(x) - y) < 1e-6` means
        free = {n for n in wanted if n not in namespace and not hasattr(builtins, n)}
        bind = {n: "function" for n in functions & free}
        bind.update({n: "value" for n in values & free})
        for alias, module in modules.items():
            if alias in wanted and alias not in namespace and alias not in bind:
                with contextlib.suppress(Exception):
                    namespace[alias] = importlib.import_module(module)
        if entry:
            bind[entry] = "function"
    for name, kind in sorted(bind.items()):
        if kind == "function":
            namespace[name] = _Proxy(name, state)
            continue
        try:  # a value not known yet is pending (strict rounds: left unbound, round unfinished)
            namespace[name] = state.get(name)
        except BaseException:  # not sendable, or not known: the tests that read it fail
            continue

    setup_error: str | None = None
    program_error: str | None = None  # the test program itself failed to run: an error
    if spec.mode == "cases":
        pieces: list[tuple[bool, Any]] = []
        for i, case in enumerate(spec.tests):
            try:
                pieces.append((True, compile_tests(case, f"<test {i}>")))
            except (SyntaxError, ValueError, RecursionError) as e:
                pieces.append((True, f"test {i} does not compile: {e}"))
    else:
        source = str(spec.tests)
        if spec.mode == "check":
            try:
                status, error = run(compile_tests(source, "<tests>"))
            except (SyntaxError, ValueError, RecursionError) as e:
                status, error = "fail", f"{type(e).__name__}: {e}"
            if status != "ok" and not state.dirty:
                setup_error = program_error = f"test program: {error}"
            namespace["candidate"] = _Proxy(entry, state) if entry else None
        found = split(source, "check" if spec.mode == "check" else None)
        if found is None:  # cannot split: the whole check is one case
            call = "check(candidate)" if spec.mode == "check" else source
            try:
                found = [(True, compile_tests(call, "<test>"))]
            except (SyntaxError, ValueError, RecursionError) as e:
                found = [(True, f"the tests do not compile: {e}")]
        pieces = found

    total = sum(1 for is_case, _ in pieces if is_case)
    passed = timeouts = 0
    failures: list[str] = []
    crashed: str | None = None
    final = True  # every case so far ran before the round's first unknown call
    index = 0
    for is_case, code in pieces:
        if not is_case:
            if setup_error is None:
                status, error = run(code)
                if status not in ("ok", "unknown") and not state.dirty:
                    setup_error = f"test set-up failed: {error}"
            continue
        if setup_error is not None:
            status, error = "fail", setup_error
        elif isinstance(code, str):
            status, error = "fail", code
        else:
            status, error = run(code)
        if state.dirty:
            final = False
        elif status == "ok":
            passed += 1
        else:
            timeouts += status == "timeout"
            if status == "crash" and crashed is None:
                crashed = error
            failures.append(f"case {index}: {error}")
            if spec.fail_fast:
                break
        index += 1
    decided = final or (spec.fail_fast and bool(failures))
    return Round(
        decided=decided,
        total=total,
        passed=passed,
        case_timeouts=timeouts,
        failures=tuple(failures[:5]),
        crashed=crashed,
        setup_error=program_error,
        calls=() if decided else tuple(state.new.values()),
    )
