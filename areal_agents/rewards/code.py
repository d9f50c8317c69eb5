r"""Unit tests for submitted code: all-pass 1.0 else 0.0 (or the fraction passed).

The result's ``status`` keeps the reasons apart:

* ``correct`` — every case passed; ``wrong`` / ``partial`` — some failed;
* ``timeout`` — a call, a case or the whole run ran out of time (never folded into ``wrong``);
* ``error`` — the submitted program did not load (syntax error, exception at import, no entry
  point, out of memory), or it ended the test run during a call;
* ``no_answer`` — the response held no code.

A broken sandbox (container gone) raises :class:`~areal_agents.errors.SandboxError` instead:
an infrastructure fault is never a reward.

How the tests are run (the judge on the host, the program in the sandbox, record and replay)
and why nothing the program under test can read, write or fake decides its grade is in
:mod:`._unit_tests`, with the shapes the tests may take (:attr:`UnitTests.mode`). The judge
runs the tests and the task's preamble on the host: take test sets (a JSONL of tasks) only from
sources you would take a Python package from.

>>> tests = UnitTests(tests=("assert add(2, 0) == 2", "assert add(1, 2) == 3"), entry_point="add")
>>> reward = UnitTestReward(backend="process")
>>> reward("```python\ndef add(a, b):\n    return a + b\n```", tests).status
'correct'
>>> reward("```python\ndef add(a, b):\n    return a - b\n```", tests).details["passed"]
1
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from areal_agents.errors import InfrastructureError
from areal_agents.rewards._safe_text import error_text
from areal_agents.rewards._unit_tests import MAX_RUNS as MAX_RUNS
from areal_agents.rewards._unit_tests import (
    TestReport,
    UnitTests,
    judge_pool,
    prewarm_judge,
    run_unit_tests,
)
from areal_agents.rewards.base import Reward, RewardResult
from areal_agents.rewards.extract import extract_code_blocks
from areal_agents.sandboxes import Sandbox, make_sandbox

__all__ = [
    "TestReport",
    "UnitTestReward",
    "UnitTests",
    "assemble_program",
    "judge_pool",
    "prewarm_judge",
    "run_unit_tests",
    "select_code",
]


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a NUL byte, deep nesting
        return None


def _defines(code: str, name: str) -> bool:
    tree = _parse(code)
    if tree is None:
        return f"def {name}(" in code
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.name == name
        for node in tree.body
    )


def select_code(response: str, entry_point: str | None = None) -> str | None:
    """The program in a response: the last fenced Python block that defines ``entry_point``,
    else the last fenced block, else the whole response when it is Python defining it."""
    blocks = [b for b in extract_code_blocks(response) if b.strip()]
    if blocks:
        if entry_point:
            defining = [b for b in blocks if _defines(b, entry_point)]
            if defining:
                return defining[-1]
        return blocks[-1]
    text = response.strip()
    if text and entry_point and _defines(text, entry_point):
        return text if _parse(text) is not None else None
    return None


def assemble_program(code: str, tests: UnitTests) -> str:
    """The preamble plus the submitted code; a body-only completion finishes the preamble's
    function, a full definition replaces it."""
    if not tests.preamble:
        return code
    if tests.entry_point and not _defines(code, tests.entry_point):
        lines = code.splitlines()
        first = next((ln for ln in lines if ln.strip()), "")
        if first and not first[0].isspace():  # an unindented body: indent it
            code = "\n".join(("    " + ln) if ln.strip() else ln for ln in lines)
        return tests.preamble.rstrip("\n") + "\n" + code + "\n"
    return tests.preamble.rstrip("\n") + "\n\n\n" + code + "\n"


class UnitTestReward(Reward):
    """Reward a program by hidden unit tests: the program runs in a sandbox, the tests on the
    host (see :mod:`._unit_tests`).

    The sandbox enforces ``timeout_s``, so :meth:`acall` waits a little longer and still gets
    the per-case report of a run that timed out. ``reference`` is :class:`UnitTests`, a mapping
    (:meth:`UnitTests.from_mapping`) or a string, which is the test program itself.

    Args:
        mode: ``"all"`` (1.0 when every case passes, else 0.0) or ``"fraction"`` (passed/total).
        timeout_s: limit for the sandbox runs of one grade; ``case_timeout_s`` for one call of
            the solution (and for one case of the tests on the host).
        timeout_reward: the reward of a run that timed out (status ``"timeout"``).
        sandbox: run in this sandbox (it is reset first, then left open); without one, every
            call opens a fresh sandbox of ``backend`` with ``sandbox_options`` and closes it.
    """

    def __init__(
        self,
        *,
        mode: str = "all",
        timeout_s: float = 30.0,
        case_timeout_s: float = 5.0,
        timeout_reward: float = 0.0,
        sandbox: Sandbox | None = None,
        backend: str = "auto",
        sandbox_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.acall_slack_s = 15.0
        if mode not in ("all", "fraction"):
            raise ValueError(f"mode={mode!r}: choose 'all' or 'fraction'")
        self.mode = mode
        self.timeout_s = timeout_s
        self.case_timeout_s = case_timeout_s
        self.timeout_reward = timeout_reward
        self.sandbox = sandbox
        self.backend = backend
        self.sandbox_options = dict(sandbox_options or {})

    def __call__(self, response: str, reference: Any) -> RewardResult:
        if isinstance(reference, UnitTests):
            tests = reference
        elif isinstance(reference, str):  # the test program itself
            tests = UnitTests(tests=reference)
        else:
            tests = UnitTests.from_mapping(reference)
        code = select_code(response, tests.entry_point)
        if code is None:
            return RewardResult(0.0, "no_answer", {"error": "no Python code block found"})
        return self.check(code, tests)

    def check(
        self,
        code: str,
        tests: UnitTests,
        sandbox: Sandbox | None = None,
        *,
        reset: bool = True,
    ) -> RewardResult:
        """Score already-extracted ``code`` in ``sandbox`` (or the reward's own, or a fresh
        one). A given sandbox is reset first unless ``reset=False`` (when it is known clean)."""
        try:
            return self._check(code, tests, sandbox, reset)
        except InfrastructureError:
            raise
        except Exception as e:  # nothing a solution does may end the caller's step
            return RewardResult(0.0, "error", {"error": f"grading failed: {error_text(e)}"})

    def _check(
        self, code: str, tests: UnitTests, sandbox: Sandbox | None, reset: bool
    ) -> RewardResult:
        program = assemble_program(code, tests)
        box = sandbox or self.sandbox
        if box is not None:
            if reset:
                box.reset()
            report = run_unit_tests(
                box,
                program,
                tests,
                timeout_s=self.timeout_s,
                case_timeout_s=self.case_timeout_s,
                fail_fast=self.mode == "all",
            )
        else:
            with make_sandbox(self.backend, **self.sandbox_options) as fresh:
                report = run_unit_tests(
                    fresh,
                    program,
                    tests,
                    timeout_s=self.timeout_s,
                    case_timeout_s=self.case_timeout_s,
                    fail_fast=self.mode == "all",
                )
        return self.result(report)

    def result(self, report: TestReport) -> RewardResult:
        """The reward and status for a :class:`TestReport`."""
        details: dict[str, Any] = {
            "passed": report.passed,
            "total": report.total,
            "case_timeouts": report.case_timeouts,
        }
        if report.failures:
            details["failures"] = list(report.failures)
        if report.run_timed_out or (report.case_timeouts and report.passed < report.total):
            details["error"] = (
                "the test run timed out" if report.run_timed_out else "a case timed out"
            )
            return RewardResult(self.timeout_reward, "timeout", details)
        if report.load_error is not None:
            details["error"] = report.load_error
            return RewardResult(0.0, "error", details)
        if report.total and report.passed == report.total:
            return RewardResult(1.0, "correct", details)
        if self.mode == "fraction" and report.total:
            value = report.passed / report.total
            return RewardResult(value, "partial" if report.passed else "wrong", details)
        return RewardResult(0.0, "wrong", details)
