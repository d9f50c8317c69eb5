"""The judge: the hidden tests, run on the host against a solution that stays in the sandbox.

One :func:`judge_round` runs in a fresh, confined grading process (:func:`~areal_agents.rewards.
isolation.run_isolated`). It executes the trusted code (the task's preamble, then the tests)
with the solution's names bound to proxies. A proxy call whose answer is known (``answers``,
the executor's records by call id) returns a fresh plain value decoded from the wire form, or
raises what the solution raised; a call not known yet is recorded for the next sandbox run.
The caller repeats rounds until one needs no unknown call: that round's outcomes are the
verdict (:mod:`areal_agents.rewards._unit_tests` has the loop).

The verdict does not depend on the test file's shape:

* **Every statement counts.** The tests run statement by statement (a snippet of ``cases``,
  a top-level statement of a program, a statement of HumanEval's ``check``), then what
  pytest would still run (:mod:`._collect`: test functions never called, ``Test*`` classes,
  ``unittest.TestCase`` classes never run). A statement that fails, whatever it is and
  whatever it raised (an ``assert``, ``raise AssertionError`` in an ``if``, a ``test()`` call,
  a ``__main__`` guard, ``unittest.main()``, ``sys.exit(1)``), fails the verdict.
  ``sys.exit(0)`` ends the program as it would in Python.
* **What decides is recorded out of band.** A failed ``assert``, a unittest failure, a call
  that timed out, crashed or answered with something unsendable, and the case alarm are
  written into the round's record *before* anything is raised, so a test's bare ``except:``,
  ``except BaseException``, ``contextlib.suppress``, ``finally: return`` or ``__del__``
  around it changes nothing; a unittest test that catches its own failed assertion, or skips
  itself once it has called the solution, fails.
* **A case is a statement that checks the solution.** For ``passed``/``total`` (what
  ``fraction`` mode pays) a statement counts when it fails, or when it ran a check (an
  ``assert``, a ``raise`` or an exit with a status, a function of the tests holding one, a
  unittest test) and involved the solution: it called the solution, or read one of its
  values or a name an earlier such statement bound. So
  ``assert True`` pays nothing, and ``x = f()`` alone is not a case while ``assert x == 1``
  is. A test program that never involves the solution scores nothing.
* **Nothing formatted from a value can raise**: messages are built with a guarded ``str``
  (an int past the 4300-digit limit, a failing ``__str__``, lone surrogates are escaped),
  under the case alarm (a ``__repr__`` that never returns is a case timeout).

Discovery: so that one round finds a whole loop's worth of calls (``for x in xs: assert
f(x) == g(x)``), an unknown call returns a *pending* placeholder that says yes to comparisons
and no-ops through arithmetic. Nothing a round computes with a placeholder counts: a statement
is only final when it ran before any unknown call of its round. Test code that loops for ever
on placeholders runs out of its operation budget (or the round's time, after which the caller
runs strict rounds, where an unknown call stops its statement at once).

Every random draw of the tests is made reproducible (``random`` is seeded the same before each
round), so that the calls of one round are the calls of the next.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import io
import random
import signal
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from areal_agents.rewards._calls import (
    Call,
    _describe,
    _JudgeTimeout,
    _Proxy,
    _Signal,
    _State,
    safe_str,
)
from areal_agents.rewards._cases import (
    Piece,
    assigned,
    piece,
    preamble_code,
    referenced,
    solution_names,
    split,
)
from areal_agents.rewards._collect import leftovers, test_like, unittest_hooks
from areal_agents.rewards._grader import warm_up
from areal_agents.rewards._wire import dumps

__all__ = ["Call", "JudgeSpec", "Round", "judge_round"]

_FINAL = ("fail", "timeout", "crash")


@dataclass(frozen=True)
class JudgeSpec:
    """What a round needs: the tests (as in :class:`~areal_agents.rewards.UnitTests`), the
    solution's source (only parsed here, for its top-level names) and the limits.
    ``deadline``: the grade's end (``time.monotonic()``, the same clock in every process);
    statements that would run past it are timeouts."""

    tests: tuple[str, ...] | str
    mode: str
    entry_point: str | None
    preamble: str
    solution: str
    case_timeout_s: float
    fail_fast: bool
    deadline: float | None = None


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


@contextlib.contextmanager
def _limit(state: _State, seconds: float) -> Iterator[None]:
    """The case alarm: recorded, then raised, and raised again every 0.1 s should the tests
    catch it."""

    def alarm(signum: int, frame: Any) -> None:
        state.note("timeout", f"the tests ran past {seconds:g} s")
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        raise _JudgeTimeout(f"the tests ran past {seconds:g} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---- one round -----------------------------------------------------------------------------


def judge_round(spec: JudgeSpec, answers: dict[str, str], discovery: bool) -> Round:
    """Run the tests once against ``answers`` (see the module docstring)."""
    saved = random.getstate(), sys.modules.get("__main__"), sys.argv
    random.seed(0x5EED)
    main = types.ModuleType("__main__")  # what `if __name__ == "__main__"` and unittest see
    sys.modules["__main__"], sys.argv = main, ["tests"]
    state = _State(answers, discovery)
    ran: set[type] = set()
    uses_unittest = "unittest" in "".join([*_sources(spec), spec.preamble])
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
            stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            if uses_unittest:
                stack.enter_context(unittest_hooks(state, ran))
            return _Round(spec, state, main.__dict__, ran).run()
    finally:
        random.setstate(saved[0])
        sys.argv = saved[2]
        if saved[1] is not None:
            sys.modules["__main__"] = saved[1]


def _sources(spec: JudgeSpec) -> list[str]:
    return [spec.tests] if isinstance(spec.tests, str) else list(spec.tests)


class _Round:
    def __init__(
        self, spec: JudgeSpec, state: _State, namespace: dict[str, Any], ran: set[type]
    ) -> None:
        self.spec, self.state, self.namespace, self.ran = spec, state, namespace, ran
        namespace.update(__builtins__=builtins, __areal_fail__=self.fail)
        namespace["__areal_seen__"] = self.seen
        self.values: set[str] = set()  # names bound to the solution's values
        self.tainted: set[str] = set()  # names bound by statements that involved the solution
        self.test_functions: dict[str, bool] = {}  # defined by the tests: name -> was called
        self.total = self.passed = self.timeouts = 0
        self.failures: list[str] = []
        self.crashed: str | None = None
        self.program_error: str | None = None
        self.final = True  # every statement so far ran before the round's first unknown call
        self.stopped = False  # the tests ended the program (sys.exit(0)) or a final failure

    # -- hooks the compiled asserts call

    def seen(self) -> None:
        self.state.checks += 1

    def fail(self, message: Any = None) -> None:
        if self.state.dirty:
            return  # placeholders: nothing counts, let the statement go on
        text = "AssertionError" if message is None else f"AssertionError: {safe_str(message)}"
        self.state.note("fail", text)
        raise AssertionError() if message is None else AssertionError(message)

    # -- set-up

    def bind(self) -> None:
        spec, namespace = self.spec, self.namespace
        namespace["__name__"] = "__main__"
        if spec.preamble.strip():
            code = preamble_code(spec.preamble)
            if code is not None:
                with contextlib.suppress(BaseException), _limit(self.state, spec.case_timeout_s):
                    exec(code, namespace)
        namespace["__name__"] = "__main__"
        entry = spec.entry_point
        if spec.mode == "check":
            bind: dict[str, str] = {entry: "function"} if entry else {}
        else:
            sources = _sources(spec)
            wanted = referenced(sources)
            own = assigned(sources)
            functions, values, modules = solution_names(spec.solution)
            # never a name the tests bind themselves, the preamble defines or a builtin:
            # `def abs(x): return 0` or `EXPECTED = 0` must not change what the tests mean
            free = {
                n
                for n in wanted
                if n not in namespace and n not in own and not hasattr(builtins, n)
            }
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
                namespace[name] = _Proxy(name, self.state)
                continue
            self.values.add(name)
            try:  # a value not known yet is pending (strict rounds: left unbound)
                namespace[name] = self.state.get(name)
            except BaseException:  # not sendable, or not known: the tests that read it fail
                continue
        if spec.mode == "check" and entry:
            namespace["candidate"] = _Proxy(entry, self.state)
        self.state.interactions = 0  # reading values at set-up is not a statement's doing

    # -- statements

    def pieces(self) -> list[tuple[str, Piece]]:
        spec = self.spec
        if spec.mode == "cases":
            return [("case", piece(case, f"<test {i}>")) for i, case in enumerate(spec.tests)]
        source = str(spec.tests)
        found = split(source, None)
        if found is None:
            whole = piece(source, "<tests>")
            return [("program", whole)]
        labelled = [("program", p) for p in found]
        if spec.mode == "check":
            body = split(source, "check")
            if body is None:
                body = [piece("check(candidate)", "<test>")]
            labelled += [("check", p) for p in body]
        return labelled

    def involved(self, codes: tuple[Any, ...], interactions: int) -> bool:
        if self.state.interactions > interactions:
            return True
        watched = self.values | self.tainted
        return bool(watched) and any(_names(code, self.namespace) & watched for code in codes)

    def step(self, kind: str, item: Piece | Callable[[], Any], codes: tuple[Any, ...] = ()) -> None:
        """Run one statement (or one leftover test, whose ``codes`` say what it may read) and
        count it."""
        state = self.state
        if isinstance(item, Piece) and isinstance(item.code, str):  # does not compile
            self.count("fail", item.code, kind, case=True)
            return
        budget = self.spec.case_timeout_s
        if self.spec.deadline is not None:
            budget = min(budget, self.spec.deadline - time.monotonic())
        events, interactions, checks = len(state.events), state.interactions, state.checks
        escaped: str | None = None
        if budget <= 0:
            state.note("timeout", "the grade ran out of time")
        else:
            try:
                with _limit(state, budget):  # describing what escaped may loop too
                    try:
                        if isinstance(item, Piece):
                            exec(item.code, self.namespace)
                        else:
                            item()
                    except SystemExit as e:
                        if e.code in (None, 0, False):
                            self.stopped = True  # the program ended, as it would in Python
                        else:
                            escaped = f"SystemExit: {safe_str(e.code)}"
                    except _Signal:
                        pass  # recorded already (or an unknown call: the round is not final)
                    except BaseException as e:
                        escaped = _describe(e)
            except _Signal:
                pass  # the case alarm, recorded already
        new = state.events[events:]
        if isinstance(item, Piece):
            codes = (item.code,)
        elif not codes:
            target = getattr(item, "__wrapped__", item)
            codes = (target.__code__,) if hasattr(target, "__code__") else ()
        if new:
            status, message = new[0]
        elif state.dirty:
            self.final = False
            return
        elif escaped is not None:
            status, message = "fail", escaped
        else:
            status, message = "ok", ""
        involved = self.involved(codes, interactions)
        ran_check = state.checks > checks or (isinstance(item, Piece) and item.checks)
        if involved and isinstance(item, Piece):
            # what it bound, and the containers it passed (the solution may change them)
            self.tainted |= item.stores
            for name in item.code.co_names:
                if type(self.namespace.get(name)) in (list, dict, set):
                    self.tainted.add(name)
        program = kind == "program" and self.spec.mode == "check"
        if program and status in _FINAL and not involved and self.program_error is None:
            self.program_error = f"test program: {message}"
        self.count(status, message, kind, case=status in _FINAL or (ran_check and involved))

    def count(self, status: str, message: str, kind: str, *, case: bool) -> None:
        if not case:
            return
        self.total += 1
        if status == "ok":
            self.passed += 1
            return
        self.timeouts += status == "timeout"
        if status == "crash" and self.crashed is None:
            self.crashed = message
        self.failures.append(f"case {self.total - 1}: {message}")
        if self.spec.fail_fast:
            self.stopped = True

    def track(self) -> None:
        """Note the test functions defined so far (wrapped, to know if they get called)."""
        for name, value in list(self.namespace.items()):
            if name in self.test_functions or not test_like(name, value):
                continue
            self.test_functions[name] = False
            self.namespace[name] = self._tracked(name, value)

    def _tracked(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.test_functions[name] = True
            return fn(*args, **kwargs)

        return wrapper

    def run(self) -> Round:
        self.bind()
        for kind, item in self.pieces():
            self.step(kind, item)
            self.track()
            if self.stopped:
                break
        if not self.stopped:
            for leftover, codes in leftovers(self.namespace, self.test_functions, self.ran):
                self.step("auto", leftover, codes)
                if self.stopped:
                    break
        decided = self.final or (self.spec.fail_fast and bool(self.failures))
        failures = list(self.failures)
        if decided and self.total == 0:
            failures.append("no test checked the solution (nothing in the tests called it)")
        return Round(
            decided=decided,
            total=self.total,
            passed=self.passed,
            case_timeouts=self.timeouts,
            failures=tuple(failures[:5]),
            crashed=self.crashed,
            setup_error=self.program_error,
            calls=() if decided else tuple(self.state.new.values()),
        )


def _names(code: Any, namespace: dict[str, Any]) -> set[str]:
    """The global names ``code`` (and the code inside it, and the tests' functions it names)
    may read."""
    names: set[str] = set()
    seen: set[int] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        if id(current) in seen or not isinstance(current, types.CodeType):
            continue
        seen.add(id(current))
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
        for name in current.co_names:
            value = namespace.get(name)
            inner = getattr(value, "__wrapped__", value)
            if isinstance(inner, types.FunctionType):
                stack.append(inner.__code__)
    return names


@warm_up
def _rehearse() -> None:
    """A round on trusted input, so that a fresh worker's first real round finds the pages it
    touches already copied (see :mod:`._grader`)."""
    import pickle

    spec = JudgeSpec(
        "def check(candidate):\n    assert candidate(1) == 2\n    assert True\n",
        "check",
        "f",
        'def f(x):\n    """One more."""\n',
        "def f(x):\n    return x + 1\n",
        5.0,
        True,
    )
    spec = pickle.loads(pickle.dumps(spec))
    first = judge_round(spec, {}, True)
    answers = {call.key: dumps({"ok": 2}) for call in first.calls}
    pickle.dumps(judge_round(spec, answers, True))
