"""Running a submitted program against the hidden tests of a coding task: the tests on the
host, the program in a sandbox. :class:`~areal_agents.rewards.code.UnitTestReward` turns the
:class:`TestReport` of :func:`run_unit_tests` into a reward and a status.

How a grade is reached (and why it cannot be forged)
----------------------------------------------------
Nothing the program under test can read, write or fake decides its grade. Inside its own
process and sandbox it can read every secret (stack frames, ``/proc/*/cmdline``, the
environment, files), write any output, exit with any status, patch any module and build
objects whose ``==`` says yes. So the verdict is reached elsewhere:

* The **judge** (:mod:`._judge`) runs on the host, in a killable grading process
  (:mod:`.isolation`). It executes the trusted code only: the task's preamble (HumanEval's
  prompt, whose helpers such as ``poly`` the tests use) and the tests, with the solution's
  names bound to proxies. Expected values never enter the sandbox. The tests are therefore
  host code: take test sets (a JSONL of tasks) only from sources you would take a Python
  package from.
* The **executor** (:mod:`._executor`, stdlib-only source sent into the sandbox) loads the
  solution and answers a batch of calls ``(name, args, kwargs)``: the return value, the
  exception (type name and message), or a per-call timeout; and the arguments it changed in
  place.
* Values cross the wall in a tagged, type-strict wire form (:mod:`._wire`): only exact
  ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``,
  ``tuple``, ``dict``, ``set`` and ``frozenset``, nesting and size capped. Anything else (a
  subclass, an object with a forged ``__eq__``, a generator, a module, ``NotImplemented``) is
  "a value of type X", which fails that call. The judge decodes into fresh plain objects, so
  the tests' own comparisons see only values the host built.
* **Record and replay**: a judge round runs every case; a proxy call whose answer is not known
  yet is recorded (and, so that one round finds a whole loop's calls, returns a placeholder
  whose results never count). The batch goes to the sandbox in one run; the next round replays
  the tests with the answers. A round that needs no unknown call decides. Usually one sandbox
  run and two rounds; at most :data:`MAX_RUNS` runs within ``timeout_s``. ``random`` is seeded
  alike in every round, so that tests that draw inputs ask the same calls each time.
* The answers are read on the host as text only: lines ``@areal:KIND ID PAYLOAD``; the first
  readable line per id of the batch wins, other ids and garbage are ignored; payloads are
  decoded in the judge's killable process (depth-capped, no recursion past the cap). Forging
  an answer line, printing to any descriptor, exiting early or killing the executor can only
  change the program's *own* answers, which it controls anyway; a call still running when the
  run ends is a timeout (or a crash), calls not reached go to the next run, and a run that
  answers nothing fails its calls.

The tests come in three shapes (:attr:`UnitTests.mode`): ``cases`` (snippets, each a case),
``check`` (HumanEval: the statements of ``check(candidate)`` that hold an ``assert`` are the
cases) and ``program`` (top-level asserts over several names of the solution: its functions
become proxies, its other top-level values are fetched as values, and stdlib modules it
imports are bound to the host's). Limits: the solution's functions must be pure as far as the
tests can tell (calls run in batches, a batch per process; equal calls are answered once), and
classes and other objects cannot be tested (they are "a value of type ...").
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_agents.errors import InfrastructureError, RewardTimeout
from areal_agents.rewards._judge import Call, JudgeSpec, Round, judge_round
from areal_agents.rewards._pool import GraderPool, GradingSession
from areal_agents.rewards._safe_text import error_text, safe_text
from areal_agents.rewards._wire import dumps
from areal_agents.rewards.isolation import named_pool
from areal_agents.sandboxes import ExecResult, Sandbox

__all__ = [
    "MAX_RUNS",
    "TestReport",
    "UnitTests",
    "judge_pool",
    "prewarm_judge",
    "run_unit_tests",
]

#: Most sandbox runs one grade may take (each answers a batch of calls; usually one is enough,
#: and each must answer a call the others did not; ``timeout_s`` bounds them all).
MAX_RUNS = 64
_JUDGE_MIN_S = 5.0
_MARK = "@areal:"


def judge_pool() -> GraderPool:
    """The grading pool the judge's rounds run in (its zygote holds only the judge)."""
    return named_pool("judge", preload=(judge_round.__module__,))


def prewarm_judge(*, wait: bool = False) -> None:
    """Start the judge's grading process now (the code environment does, when it is built),
    so that the first grade does not wait for it."""
    judge_pool().start(wait=wait)


def _executor_source() -> str:
    here = Path(__file__).parent
    executor = (here / "_executor.py").read_text()
    executor = executor.replace("from __future__ import annotations\n", "", 1)
    return (here / "_wire.py").read_text() + "\n" + executor


_EXECUTOR = _executor_source()


@dataclass(frozen=True)
class UnitTests:
    """The hidden tests of a coding task.

    Attributes:
        tests: a sequence of snippets (each one test case, e.g. ``"assert f(1) == 2"``), or one
            test program: HumanEval-style (defines ``check(candidate)``; needs
            ``entry_point``), or plain top-level asserts.
        entry_point: the function the solution must define (``check`` gets it as
            ``candidate``); ``None`` when the tests need no particular name.
        preamble: code that goes before the solution (HumanEval's prompt: imports, helper
            functions and the signature, so that a body-only completion also works). The judge
            runs it too, on the host: the helpers the tests use are the preamble's, never the
            solution's. It is trusted, like the tests.
    """

    tests: tuple[str, ...] | str
    entry_point: str | None = None
    preamble: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.tests, str):
            object.__setattr__(self, "tests", tuple(str(t) for t in self.tests))
            if not self.tests:
                raise ValueError("UnitTests needs at least one test case")

    @property
    def mode(self) -> str:
        """``cases``, ``check`` or ``program`` (how the runner splits the tests into cases)."""
        if not isinstance(self.tests, str):
            return "cases"
        if self.entry_point and "def check(" in self.tests:
            return "check"
        return "program"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> UnitTests:
        """From ``{"tests": ..., "entry_point": ..., "preamble"/"prompt_code": ...}``."""
        tests = data.get("tests", data.get("test"))
        if tests is None:
            raise ValueError(f"unit tests need a 'tests' key, got {sorted(data)}")
        return cls(
            tests=tests if isinstance(tests, str) else tuple(tests),
            entry_point=data.get("entry_point"),
            preamble=str(data.get("preamble", "")),
        )


@dataclass(frozen=True)
class TestReport:
    """What the runner saw: per-case outcomes and how the run ended."""

    __test__ = False  # not a pytest class

    total: int
    passed: int
    case_timeouts: int
    run_timed_out: bool
    load_error: str | None
    failures: tuple[str, ...]
    stdout: str


def run_unit_tests(
    sandbox: Sandbox,
    code: str,
    tests: UnitTests,
    *,
    timeout_s: float = 30.0,
    case_timeout_s: float = 5.0,
    fail_fast: bool = False,
) -> TestReport:
    """Run ``tests`` against ``code`` (already assembled) in ``sandbox`` (see the module
    docstring); infrastructure faults raise :class:`~areal_agents.errors.SandboxError`.
    ``fail_fast`` stops at the first failing case (the cases after it count as not passed)."""
    pool = judge_pool()
    pool.start(wait=True)  # its start-up is not the grade's
    with pool.session() as session:  # the rounds of this grade share one fresh worker
        return _run_unit_tests(session, sandbox, code, tests, timeout_s, case_timeout_s, fail_fast)


def _run_unit_tests(
    session: GradingSession,
    sandbox: Sandbox,
    code: str,
    tests: UnitTests,
    timeout_s: float,
    case_timeout_s: float,
    fail_fast: bool,
) -> TestReport:
    deadline = time.monotonic() + timeout_s
    spec = JudgeSpec(
        tests=tests.tests,
        mode=tests.mode,
        entry_point=tests.entry_point,
        preamble=tests.preamble,
        solution=code,
        case_timeout_s=case_timeout_s,
        fail_fast=fail_fast,
        deadline=deadline,
    )
    limits = getattr(sandbox, "limits", None)
    budget = max(1024, int(getattr(limits, "max_output_bytes", 64 * 1024)) - 4096)
    answers: dict[str, str] = {}
    discovery, loaded, runs, stdout = True, False, 0, ""
    while True:
        judge_s = max(_JUDGE_MIN_S, deadline - time.monotonic())
        try:
            found = session.run(judge_round, spec, answers, discovery, timeout_s=judge_s)
        except RewardTimeout:
            if discovery and deadline - time.monotonic() > 0:
                discovery = False  # placeholders sent the tests into a loop: find calls one by one
                continue
            return _unfinished(None, "the tests ran out of time on the host", timed_out=True)
        except InfrastructureError:
            raise
        except Exception as e:  # GradingFailed, or a fault of the judge: never out of a step
            why = f"the tests could not be run: {error_text(e)}"
            return _unfinished(None, why, load_error=why)
        if found.decided and loaded:
            return _report(found, stdout)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return _unfinished(found, "the test run timed out", timed_out=True)
        if runs >= MAX_RUNS:
            return _unfinished(found, f"the tests needed more than {MAX_RUNS} sandbox runs")
        calls = () if found.decided else found.calls
        result = sandbox.run_python(
            _program(code, calls, tests.entry_point, case_timeout_s, budget), timeout=remaining
        )
        runs += 1
        run = _read(result, calls)
        if run.load_error is not None or run.load_timed_out:
            return TestReport(
                total=found.total,
                passed=0,
                case_timeouts=0,
                run_timed_out=run.load_timed_out,
                load_error=None if run.load_timed_out else run.load_error,
                failures=(),
                stdout=run.stdout,
            )
        loaded, stdout = True, run.stdout or stdout
        if found.decided:
            return _report(found, stdout)
        fresh = {k: v for k, v in run.answers.items() if k not in answers}
        if calls and not fresh:  # nothing new answered: give up on these calls, never loop
            lost = dumps({"lost": "the sandbox run answered none of its calls"})
            fresh = {call.key: lost for call in calls if call.key not in answers}
        answers.update(fresh)


def _report(found: Round, stdout: str) -> TestReport:
    load_error = found.setup_error
    if load_error is None and found.crashed is not None:
        load_error = f"the program ended the test run during a call: {found.crashed}"
    return TestReport(
        total=found.total,
        passed=found.passed,
        case_timeouts=found.case_timeouts,
        run_timed_out=False,
        load_error=load_error,
        failures=found.failures,
        stdout=stdout,
    )


def _unfinished(
    found: Round | None, why: str, *, timed_out: bool = False, load_error: str | None = None
) -> TestReport:
    total, passed, timeouts, failures = (
        (found.total, found.passed, found.case_timeouts, found.failures) if found else (0, 0, 0, ())
    )
    return TestReport(total, passed, timeouts, timed_out, load_error, (*failures, why)[:5], "")


def _program(
    code: str, calls: Sequence[Call], entry_point: str | None, limit: float, budget: int
) -> str:
    job = {
        "solution": code,
        "entry_point": entry_point,
        "calls": [[i, c.op, c.name, c.args, c.kwargs] for i, c in enumerate(calls)],
        "case_timeout": limit,
        "budget": budget,
    }
    return _EXECUTOR + f"\nmain(json.loads({json.dumps(dumps(job))}))\n"


@dataclass
class _Run:
    answers: dict[str, str] = field(default_factory=dict)
    load_error: str | None = None
    load_timed_out: bool = False
    stdout: str = ""


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _read(result: ExecResult, calls: Sequence[Call]) -> _Run:
    """The executor's lines in ``result`` (only string work here: values stay encoded until a
    judge round, in a killable process, decodes them). A line's id is the call's index in the
    batch; the first line for an id wins; lines for other ids, and anything unreadable, are
    ignored. Calls are answered in order, so in a run that did not end (no ``D`` or ``X``
    line) the first call with no answer is the one it died (or ran out of time) in."""
    batch = {str(i): call.key for i, call in enumerate(calls)}
    run = _Run()
    load: Any = None
    ended = False
    for line in result.stdout.split("\n"):
        at = line.find(_MARK)
        if at < 0:
            continue
        kind, _, rest = line[at + len(_MARK) :].partition(" ")
        ident, _, payload = rest.partition(" ")
        if kind == "L" and load is None:
            load = _loads(payload)
            load = load if isinstance(load, dict) else {"error": "unreadable load report"}
        elif kind == "R" and ident in batch and batch[ident] not in run.answers:
            if isinstance(_loads(payload), dict):
                run.answers[batch[ident]] = payload
        elif kind in ("D", "X"):
            ended = True
            text = _loads(payload) if kind == "D" else None
            run.stdout = text[-500:] if isinstance(text, str) else run.stdout
    if load is None:
        if result.timed_out:
            run.load_timed_out = True
        elif result.oom_killed:
            run.load_error = "the program ran out of memory"
        else:
            tail = (result.stderr or result.stdout)[-300:]
            run.load_error = f"the test run ended early (exit code {result.exit_code}): {tail}"
        run.load_error = None if run.load_error is None else safe_text(run.load_error)
        return run
    if "ok" not in load:
        run.load_timed_out = load.get("timeout") is True
        run.load_error = safe_text(str(load.get("error")))
        return run
    in_flight = next((c.key for c in calls if c.key not in run.answers), None)
    if in_flight is not None and not ended:
        if result.timed_out:
            run.answers[in_flight] = dumps({"timeout": True})
        elif result.oom_killed:
            run.answers[in_flight] = dumps({"crashed": "out of memory"})
        else:
            run.answers[in_flight] = dumps({"crashed": f"exit code {result.exit_code}"})
    return run
