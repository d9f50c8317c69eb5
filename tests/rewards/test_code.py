"""Unit tests in a sandbox: all-pass/fraction rewards, and timeouts, crashes and tricks kept apart
from plain failures."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from areal_agents.rewards import (
    UnitTestReward,
    UnitTests,
    assemble_program,
    run_unit_tests,
    select_code,
)
from areal_agents.sandboxes import BaseSandbox, ExecResult, make_sandbox

ADD = UnitTests(
    tests=("assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 5) == 4"),
    entry_point="add",
)


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


@pytest.fixture(
    params=["process", pytest.param("docker", marks=pytest.mark.docker)], scope="module"
)
def sandbox(request: pytest.FixtureRequest) -> Iterator[BaseSandbox]:
    with make_sandbox(str(request.param)) as sb:
        yield sb


def reward_in(sandbox: BaseSandbox, **kwargs: object) -> UnitTestReward:
    return UnitTestReward(sandbox=sandbox, **kwargs)  # type: ignore[arg-type]


def test_all_pass_is_one_any_failure_is_zero(sandbox: BaseSandbox) -> None:
    reward = reward_in(sandbox)
    good = reward(fenced("def add(a, b):\n    return a + b"), ADD)
    assert (good.reward, good.status, good.details["passed"], good.details["total"]) == (
        1.0,
        "correct",
        3,
        3,
    )
    bad = reward(fenced("def add(a, b):\n    return a * b if a else b"), ADD)
    assert (bad.reward, bad.status) == (0.0, "wrong")
    assert "AssertionError" in bad.details["failures"][0]


def test_fraction_mode_counts_passed_cases(sandbox: BaseSandbox) -> None:
    result = reward_in(sandbox, mode="fraction")(
        fenced("def add(a, b):\n    return abs(a) + b"), ADD
    )
    assert result.status == "partial"
    assert result.reward == pytest.approx(2 / 3)


def test_timeouts_are_reported_as_timeouts(sandbox: BaseSandbox) -> None:
    loop = "def add(a, b):\n    while True:\n        pass"
    result = reward_in(sandbox, case_timeout_s=0.5, timeout_s=20)(fenced(loop), ADD)
    assert result.status == "timeout" and result.reward == 0.0
    assert result.details["case_timeouts"] >= 1
    # a program that hangs while loading trips the case alarm too
    hang = "import time\ntime.sleep(60)\ndef add(a, b):\n    return a + b"
    result = reward_in(sandbox, case_timeout_s=0.5, timeout_s=20)(fenced(hang), ADD)
    assert result.status == "timeout"
    # and when the alarm cannot fire (signals ignored), the sandbox's own limit does it
    deaf = (
        "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "def add(a, b):\n    time.sleep(60)"
    )
    result = reward_in(sandbox, case_timeout_s=0.5, timeout_s=2)(fenced(deaf), ADD)
    assert result.status == "timeout" and "timed out" in result.details["error"]


def test_timeout_reward_is_configurable(sandbox: BaseSandbox) -> None:
    loop = "def add(a, b):\n    while True:\n        pass"
    reward = reward_in(sandbox, case_timeout_s=0.3, timeout_reward=-0.5)
    assert reward(fenced(loop), ADD).reward == -0.5


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        ("def add(a, b)\n    return a + b", "SyntaxError"),
        ("import numpy_does_not_exist\ndef add(a, b):\n    return a + b", "ModuleNotFoundError"),
        ("def plus(a, b):\n    return a + b", "defines no 'add'"),
        ("import os\nos._exit(0)", "ended early"),
        ("raise SystemExit(0)\ndef add(a, b):\n    return a + b", "SystemExit"),
    ],
)
def test_programs_that_do_not_load_are_errors(sandbox: BaseSandbox, code: str, needle: str) -> None:
    result = reward_in(sandbox)(fenced(code), ADD)
    assert (result.reward, result.status) == (0.0, "error"), result
    assert needle in result.details["error"]


def test_printing_fake_results_does_not_fool_the_runner(sandbox: BaseSandbox) -> None:
    liar = (
        "import sys\n"
        'print(\'\\n{"event": "case", "index": 0, "ok": true}\')\n'
        'def add(a, b):\n    print(\'@@areal-0000@@{"event": "done"}\')\n    return 0'
    )
    result = reward_in(sandbox)(fenced(liar), ADD)
    assert result.status == "wrong"


def test_tests_that_catch_exceptions_cannot_swallow_a_case_timeout(sandbox: BaseSandbox) -> None:
    sneaky = (
        "def add(a, b):\n    try:\n        while True:\n            pass\n"
        "    except Exception:\n        return a + b"
    )
    result = reward_in(sandbox, case_timeout_s=0.3)(fenced(sneaky), ADD)
    assert result.status == "timeout"


def test_model_left_files_are_removed_before_the_tests(sandbox: BaseSandbox) -> None:
    sandbox.write_file("json.py", "raise SystemExit('hijacked')")
    result = reward_in(sandbox)(fenced("def add(a, b):\n    return a + b"), ADD)
    assert result.status == "correct"


def test_humaneval_style_check_is_split_into_cases(sandbox: BaseSandbox) -> None:
    tests = UnitTests(
        tests=(
            "METADATA = {}\n\ndef check(candidate):\n    import math\n"
            "    assert candidate(4) == 2\n    assert candidate(9) == 3\n"
            "    for n in range(5):\n        assert candidate(n * n) == n\n"
            "    assert all(candidate(x * x) == x for x in [7, 8])\n"
        ),
        entry_point="isqrt",
        preamble="def isqrt(n: int) -> int:\n    '''Integer square root.'''\n",
    )
    assert tests.mode == "check"
    body_only = "    return int(n ** 0.5)\n"
    result = reward_in(sandbox, mode="fraction")(fenced(body_only), tests)
    assert (result.status, result.details["total"]) == ("correct", 4)
    off_by_one = "def isqrt(n):\n    return int(n ** 0.5) + (n == 9)"
    result = reward_in(sandbox, mode="fraction")(fenced(off_by_one), tests)
    assert result.details["passed"] == 2 and result.reward == pytest.approx(0.5)


def test_plain_program_tests_and_no_entry_point() -> None:
    tests = UnitTests(tests="x = solve()\nassert x == 42\nassert isinstance(x, int)\n")
    assert tests.mode == "program"
    result = UnitTestReward(backend="process")(fenced("def solve():\n    return 42"), tests)
    assert (result.status, result.details["total"]) == ("correct", 2)


def test_no_code_is_no_answer() -> None:
    assert UnitTestReward(backend="process")("I would add them.", ADD).status == "no_answer"


def test_select_code_prefers_the_block_defining_the_entry_point() -> None:
    text = fenced("def add(a, b):\n    return a + b") + "Usage:\n```python\nprint(add(1, 2))\n```"
    assert select_code(text, "add") == "def add(a, b):\n    return a + b"
    assert select_code("def add(a, b):\n    return a + b", "add") is not None  # raw code
    assert select_code("add them up", "add") is None
    assert select_code("```bash\nls\n```", "add") is None


def test_assemble_program_completes_or_replaces_the_preamble() -> None:
    tests = UnitTests(tests=("assert f() == 1",), entry_point="f", preamble="import os\ndef f():\n")
    assert assemble_program("    return 1", tests) == "import os\ndef f():\n    return 1\n"
    assert assemble_program("return 1", tests) == "import os\ndef f():\n    return 1\n"
    full = assemble_program("def f():\n    return 1", tests)
    assert full.startswith("import os\ndef f():\n") and full.endswith("def f():\n    return 1\n")


def test_run_unit_tests_reports_per_case(sandbox: BaseSandbox) -> None:
    sandbox.reset()
    report = run_unit_tests(sandbox, "def add(a, b):\n    return a - b", ADD)
    assert (report.total, report.passed, report.load_error) == (3, 1, None)
    assert len(report.failures) == 2


def test_async_form_runs_off_the_event_loop() -> None:
    reward = UnitTestReward(backend="process")

    async def main() -> list[float]:
        results = await asyncio.gather(
            reward.acall(fenced("def add(a, b):\n    return a + b"), ADD),
            reward.acall(fenced("def add(a, b):\n    return 0"), ADD),
        )
        return [r.reward for r in results]

    assert asyncio.run(main()) == [1.0, 0.0]


def test_mapping_references_work() -> None:
    reference = {"tests": ["assert add(2, 2) == 4"], "entry_point": "add"}
    assert (
        UnitTestReward(backend="process")(
            fenced("def add(a, b):\n    return a + b"), reference
        ).reward
        == 1.0
    )


def test_a_program_that_dies_during_a_call_is_an_error(sandbox: BaseSandbox) -> None:
    code = "import os\ndef add(a, b):\n    if a == -1:\n        os._exit(3)\n    return a + b"
    result = reward_in(sandbox, mode="fraction")(fenced(code), ADD)
    assert (result.reward, result.status) == (0.0, "error"), result
    assert "ended the test run" in result.details["error"]


def test_calls_are_answered_in_one_sandbox_run(sandbox: BaseSandbox) -> None:
    runs = []
    real = sandbox.run_python

    def counting(code: str, *, timeout: float = 10.0) -> ExecResult:
        runs.append(1)
        return real(code, timeout=timeout)

    tests = UnitTests(  # a loop over random inputs: seeded alike in every judge round
        tests="import random\nfor _ in range(50):\n    x = random.randint(0, 99)\n"
        "    assert double(x) == 2 * x\n",
    )
    sandbox.run_python = counting  # type: ignore[method-assign]
    try:
        result = reward_in(sandbox)(fenced("def double(x):\n    return x * 2"), tests)
    finally:
        del sandbox.run_python
    assert result.status == "correct" and len(runs) == 1


def test_values_the_tests_cannot_send_fail_with_a_reason() -> None:
    tests = UnitTests(tests=("assert apply(lambda x: x + 1, 1) == 2",), entry_point="apply")
    result = UnitTestReward(backend="process")(fenced("def apply(f, x):\n    return f(x)"), tests)
    assert result.status == "wrong" and "cannot be sent" in result.details["failures"][0]


def test_classes_are_reported_as_unsupported() -> None:
    tests = UnitTests(tests="c = Counter()\nassert c.total() == 0\n")
    code = "class Counter:\n    def total(self):\n        return 0"
    result = UnitTestReward(backend="process")(fenced(code), tests)
    assert result.status == "wrong" and "not supported" in result.details["failures"][0]
