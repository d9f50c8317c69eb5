"""``reward_mode="fraction"`` pays only for checks of the solution (issue 28 M2).

The red team's ``g1b_humaneval.py`` (round 3), ported: 36 of HumanEval's 164 ``check``
functions hold ``assert True`` lines (48 of them), and each counted as a passed case, so a
solution returning ``None`` scored 0.1 to 0.2 on every such task. Then new checks that no
solution can fail, in every shape of tests: ``assert candidate``, ``assert callable(f)``,
constants, comparisons of the tests' own data, ``assert True`` in a loop. A wrong solution
scores 0 in fraction mode, the honest one 1, and ``total`` counts the real checks only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import gymnasium as gym
import pytest

import areal_agents.envs  # noqa: F401  (registers the environments)
from areal_agents.envs.tasks.code import humaneval_tasks
from areal_agents.rewards import UnitTestReward, UnitTests
from areal_agents.sandboxes import BaseSandbox, make_sandbox

FRACTION = UnitTestReward(mode="fraction", timeout_s=20, case_timeout_s=3)


def _assert_true_tasks() -> list[str]:
    """The tasks whose ``check`` holds an ``assert True`` statement (g1b's static scan)."""
    found = []
    for task in humaneval_tasks():
        tree = ast.parse(task.metadata["tests"])
        checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
        body = checks[-1].body if checks else []
        if any(
            isinstance(s, ast.Assert) and isinstance(s.test, ast.Constant) and s.test.value is True
            for s in body
        ):
            found.append(task.id)
    return found


FLAGGED = _assert_true_tasks()


@pytest.fixture(scope="module")
def sandbox() -> Iterator[BaseSandbox]:
    with make_sandbox("process") as sb:
        yield sb


def test_the_scan_still_finds_the_36_tasks() -> None:
    """The data this file tests against (so that the tests below keep their teeth)."""
    assert len(FLAGGED) == 36


@pytest.mark.parametrize("task_id", FLAGGED)
def test_a_solution_failing_every_call_scores_zero_in_fraction_mode(
    sandbox: BaseSandbox, task_id: str
) -> None:
    """(It raises: ``return None`` is the right answer to a few cases of some tasks.)"""
    metadata = humaneval_tasks().get(task_id).metadata
    tests = UnitTests.from_mapping(metadata)
    wrong = f"def {tests.entry_point}(*args, **kwargs):\n    raise NotImplementedError\n"
    result = FRACTION.check(wrong, tests, sandbox=sandbox)
    assert (result.reward, result.details["passed"]) == (0.0, 0), result
    right = FRACTION.check(metadata["canonical_solution"], tests, sandbox=sandbox)
    assert (right.reward, right.status) == (1.0, "correct"), right


@pytest.mark.parametrize("mode", ["fraction", "all"])
def test_through_the_environment(mode: str) -> None:
    """g1b's own path: ``CodeSandbox-v0`` with ``source=humaneval``, the reward mode, and a
    solution returning ``None`` (they scored 0.1 to 0.2 in fraction mode)."""
    env = gym.make(
        "areal_agents/CodeSandbox-v0",
        source="humaneval",
        reward_mode=mode,
        sandbox_backend="process",
        tools=("submit",),
    )
    try:
        for task_id in FLAGGED[:6]:
            entry = humaneval_tasks().get(task_id).metadata["entry_point"]
            env.reset(options={"task_id": task_id})
            reply = f"```python\ndef {entry}(*args, **kwargs):\n    return None\n```"
            _, reward, *_ = env.step(reply)
            assert reward == 0.0, task_id
    finally:
        env.close()


VACUOUS = [  # checks no solution can fail
    "assert True",
    "assert True, 'This prints if this assert fails (good for debugging!)'",
    "assert 1 + 1 == 2",
    "assert not False",
    "assert isinstance(3, int)",
    "assert len('abc') == 3",
]
VACUOUS_ABOUT_THE_SOLUTION = [  # they name the solution but no call can fail them
    "assert {f}",
    "assert {f} is not None",
    "assert callable({f})",
    "assert isinstance({f}, object)",
    "assert len([{f}]) == 1",
]
REAL = ["assert {f}(2) == 4", "assert {f}(3) == 9"]
RIGHT = "def sq(x):\n    return x * x\n"
WRONG = "def sq(x):\n    return None\n"


def _shapes() -> dict[str, UnitTests]:
    lines = VACUOUS + VACUOUS_ABOUT_THE_SOLUTION + REAL
    check = "def check(candidate):\n" + "".join(
        "    " + line.format(f="candidate") + "\n" for line in lines
    )
    loop = "for i in range(9):\n    assert True\n" + "".join(
        line.format(f="sq") + "\n" for line in lines
    )
    return {
        "check": UnitTests(tests=check, entry_point="sq"),
        "cases": UnitTests(tests=tuple(line.format(f="sq") for line in lines), entry_point="sq"),
        "program": UnitTests(tests=loop, entry_point="sq"),
    }


@pytest.mark.parametrize("shape", ["check", "cases", "program"])
def test_checks_no_solution_can_fail_pay_nothing(sandbox: BaseSandbox, shape: str) -> None:
    tests = _shapes()[shape]
    wrong = FRACTION.check(WRONG, tests, sandbox=sandbox)
    assert (wrong.reward, wrong.details["passed"]) == (0.0, 0), wrong
    right = FRACTION.check(RIGHT, tests, sandbox=sandbox)
    assert (right.reward, right.details["total"]) == (1.0, len(REAL)), right
