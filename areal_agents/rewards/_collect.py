"""What the judge (:mod:`._judge`) runs besides the statements of the tests, as pytest would,
and how it hears of unittest's failures.

* **Leftovers** (:func:`leftovers`): after the last statement, the test functions the program
  defined and never called (``test*``, no required argument), the methods ``test*`` of its
  plain ``Test*`` classes (no ``__init__``: what pytest collects) and its
  ``unittest.TestCase`` classes none of whose tests ran. Each comes with the code objects
  the judge reads to tell whether it involved the solution.
* **unittest's failures, out of band** (:func:`unittest_hooks`): while a round runs,
  unittest's result objects record each error, failure, failed subtest and unexpected
  success into the round's record, and a test that passes although one of its own
  assertions failed inside it (``try: self.assertEqual(...) except BaseException: pass``)
  fails, as a failed ``assert`` caught by the tests does (:mod:`._cases`); so does a test that
  skips itself after it called the solution (``if f(1) != 2: self.skipTest(...)``), while a
  test skipped before it ran (``@unittest.skipIf``) counts for nothing.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from areal_agents.rewards._calls import _State, safe_str

__all__ = ["leftovers", "test_like", "unittest_hooks"]

Leftover = tuple[Callable[[], Any], tuple[types.CodeType, ...]]


def _runnable(fn: Any, bound: int = 0) -> bool:
    """A function of the tests (not the preamble's, not an import's) callable with ``bound``
    positional arguments and nothing else."""
    if not isinstance(fn, types.FunctionType):
        return False
    code = fn.__code__
    if not code.co_filename.startswith("<test"):
        return False
    required = code.co_argcount - len(fn.__defaults__ or ()) - bound
    kwonly = code.co_kwonlyargcount - len(fn.__kwdefaults__ or {})
    return required <= 0 and kwonly <= 0


def test_like(name: str, value: Any) -> bool:
    """Whether pytest would run ``value``, bound to ``name`` by the tests, as a test."""
    return name.startswith("test") and _runnable(value)


def _code(fn: Any) -> tuple[types.CodeType, ...]:
    inner = getattr(fn, "__wrapped__", fn)
    code = getattr(inner, "__code__", None)
    return (code,) if isinstance(code, types.CodeType) else ()


def _methods(cls: type) -> tuple[types.CodeType, ...]:
    return tuple(f.__code__ for f in vars(cls).values() if isinstance(f, types.FunctionType))


def _run_method(cls: type, name: str) -> None:
    getattr(cls(), name)()


def _run_test_case(cls: type) -> None:
    import unittest

    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)


def leftovers(
    namespace: dict[str, Any], test_functions: dict[str, bool], ran: set[type]
) -> list[Leftover]:
    """What pytest would still run (see the module docstring), in definition order."""
    found: list[Leftover] = [
        (namespace[name], _code(namespace[name]))
        for name, called in test_functions.items()
        if not called
    ]
    unittest = sys.modules.get("unittest")
    for value in list(namespace.values()):
        if not isinstance(value, type) or value.__module__ != "__main__":
            continue
        if unittest is not None and issubclass(value, unittest.TestCase):
            if value not in ran:
                found.append((functools.partial(_run_test_case, value), _methods(value)))
            continue
        if not value.__name__.startswith("Test") or "__init__" in vars(value):
            continue
        for name, fn in list(vars(value).items()):
            if name.startswith("test") and _runnable(fn, bound=1):
                found.append((functools.partial(_run_method, value, name), (fn.__code__,)))
    return found


@contextlib.contextmanager
def unittest_hooks(state: _State, ran: set[type]) -> Iterator[None]:
    """While a round runs, unittest's result objects also record into the round's state (see
    the module docstring); ``ran`` collects the classes whose tests started."""
    import unittest.case
    import unittest.result

    result_cls = unittest.result.TestResult
    hooked = ("startTest", "addError", "addFailure", "addSubTest", "addUnexpectedSuccess")
    saved = {n: result_cls.__dict__[n] for n in (*hooked, "addSuccess", "addSkip")}
    failure_cls = unittest.case.TestCase.failureException
    caught: list[str] = []  # the assertions that failed inside the running test
    calls_before = [0]  # the solution's calls and reads when the running test started

    class _Failure(failure_cls):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            caught.append(safe_str(args[0], 300) if args else "")

    _Failure.__name__ = _Failure.__qualname__ = failure_cls.__name__

    def name_of(test: Any) -> str:
        return safe_str(getattr(test, "_testMethodName", None) or test, 100)

    def describe(test: Any, err: Any) -> str:
        kind = err[0].__name__ if isinstance(err, tuple) and err and err[0] else "error"
        detail = safe_str(err[1], 300) if isinstance(err, tuple) and len(err) > 1 else ""
        return f"unittest {name_of(test)}: {safe_str(kind, 80)}: {detail}"

    def start(self: Any, test: Any) -> None:
        caught.clear()
        calls_before[0] = state.interactions
        state.checks += 1
        ran.add(type(test))
        saved["startTest"](self, test)

    def failed(which: str) -> Callable[..., None]:
        def hook(self: Any, test: Any, err: Any) -> None:
            state.note("fail", describe(test, err))
            saved[which](self, test, err)

        return hook

    def sub(self: Any, test: Any, subtest: Any, err: Any) -> None:
        if err is not None:
            state.note("fail", describe(subtest, err))
        saved["addSubTest"](self, test, subtest, err)

    def unexpected(self: Any, test: Any) -> None:
        state.note("fail", f"unittest {safe_str(test, 100)}: unexpected success")
        saved["addUnexpectedSuccess"](self, test)

    def success(self: Any, test: Any) -> None:
        if caught:
            state.note("fail", f"unittest {name_of(test)}: caught its own failure: {caught[0]}")
        saved["addSuccess"](self, test)

    def skipped(self: Any, test: Any, reason: Any) -> None:
        if state.interactions > calls_before[0]:
            why = safe_str(reason, 200)
            state.note(
                "fail", f"unittest {name_of(test)}: skipped after it called the solution: {why}"
            )
        else:
            state.checks -= 1  # skipped before it ran: not a check
        saved["addSkip"](self, test, reason)

    patches = {
        "startTest": start,
        "addError": failed("addError"),
        "addFailure": failed("addFailure"),
        "addSubTest": sub,
        "addUnexpectedSuccess": unexpected,
        "addSuccess": success,
        "addSkip": skipped,
    }
    for name, fn in patches.items():
        setattr(result_cls, name, fn)
    unittest.case.TestCase.failureException = _Failure
    try:
        yield
    finally:
        unittest.case.TestCase.failureException = failure_cls
        for name, fn in saved.items():
            setattr(result_cls, name, fn)
