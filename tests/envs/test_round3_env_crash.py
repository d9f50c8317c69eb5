"""No reply makes ``CodeSandbox-v0``'s ``env.step`` raise (issue 28 H6).

The rollout worker re-raises anything but an infrastructure fault, so one episode whose step
raises ends a training run. The red team's ``g3b_env_crash.py`` (round 3), ported: a task
from a JSONL-style mapping whose test is ``assert f(1) == 5, f(1)`` and a wrong solution
returning ``10**6000`` made ``env.step`` raise ``ValueError: Exceeds the limit (4300
digits)``. Then the environment probes of ``g3_crashpaths.py`` (NUL bytes, deep nesting, lone
surrogates, bad escapes in the reply), and new ones: other tests that turn the value into
text, solutions that raise what a test does not expect, and replies that end the executor.
Each step must return, with a reward of 0 and details that encode as UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest

import areal_agents.envs  # noqa: F401  (registers the environments)


@pytest.fixture(scope="module")
def env() -> Iterator[gym.Env[Any, Any]]:
    env = gym.make("areal_agents/CodeSandbox-v0", sandbox_backend="process")
    yield env
    env.close()


def _step(
    env: gym.Env[Any, Any], task: dict[str, object], reply: str
) -> tuple[float, dict[str, Any]]:
    env.reset(options={"task": task})
    _, reward, terminated, _, info = env.step(reply)
    assert terminated
    details = info["reward_details"]
    json.dumps(details, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
    return float(reward), details


def _task(test: str) -> dict[str, object]:
    return {"prompt": "write f", "tests": [test], "entry_point": "f"}


def _fenced(code: str) -> str:
    return f"```python\n{code}```"


def test_a_huge_value_in_the_tests_message_is_a_wrong_answer(env: gym.Env[Any, Any]) -> None:
    """g3b_env_crash.py."""
    wrong = _fenced("def f(x):\n    return 10**6000\n")
    reward, details = _step(env, _task("assert f(1) == 5, f(1)"), wrong)
    assert (reward, details["status"]) == (0.0, "wrong")


TESTS_FORMATTING_THE_VALUE = {
    "dict_lookup": "assert {5: 1}[f(1)] == 1",
    "list_message": "assert f(1) == 5, [f(1)]",
    "f_string": "assert f(1) == 5, f'{f(1)}'",
    "str_compare": "assert str(f(1)) == '5'",
    "raise_with_the_value": "if f(1) != 5:\n    raise ValueError(f(1))",
    "exit_with_the_value": "import sys\nif f(1) != 5:\n    sys.exit(f(1))",
}


@pytest.mark.parametrize(
    "test", list(TESTS_FORMATTING_THE_VALUE.values()), ids=list(TESTS_FORMATTING_THE_VALUE)
)
def test_any_test_formatting_a_huge_value_is_a_wrong_answer(
    env: gym.Env[Any, Any], test: str
) -> None:
    reward, details = _step(env, _task(test), _fenced("def f(x):\n    return 10**6000\n"))
    assert (reward, details["status"]) == (0.0, "wrong"), details


SOLUTIONS_THAT_END_BADLY = {
    "raises_keyboard_interrupt": "def f(x):\n    raise KeyboardInterrupt\n",
    "raises_system_exit": "def f(x):\n    raise SystemExit(10**6000)\n",
    "raises_a_surrogate": "def f(x):\n    raise ValueError('\\ud800' * 5)\n",
    "raises_at_import": "raise ValueError('\\udcff at import')\n",
    "exits_the_executor": "import os\ndef f(x):\n    os._exit(0)\n",
    "kills_itself": "import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "prints_a_flood": "def f(x):\n    print('\\ud800' * 10**6)\n    return 4\n",
    "returns_a_generator": "def f(x):\n    return (i for i in ())\n",
}


@pytest.mark.parametrize(
    "code", list(SOLUTIONS_THAT_END_BADLY.values()), ids=list(SOLUTIONS_THAT_END_BADLY)
)
def test_a_solution_that_ends_badly_scores_zero(env: gym.Env[Any, Any], code: str) -> None:
    reward, details = _step(env, _task("assert f(1) == 5, f(1)"), _fenced(code))
    assert reward == 0.0 and details["status"] != "correct", details


def _add(body: str) -> str:
    return f"```python\ndef add(a, b):\n    return {body}\n```"


REPLIES = {  # g3_crashpaths.py's environment probes, then new ones
    "nul_in_a_code_block": ("gen/add/7", "```python\ndef add(a, b):\n    return a + b\x00\n```"),
    "nul_through_submit": (
        "gen/add/7",
        '<tool_call>{"name": "submit", "arguments": '
        '{"code": "def add(a, b):\\n    return 1\\u0000"}}</tool_call>',
    ),
    "nul_in_a_humaneval_body": ("HumanEval/0", "```python\n    return True\x00\n```"),
    "deep_parentheses": ("gen/add/7", _add("(" * 300000)),
    "lone_surrogate_in_the_code": ("gen/add/7", _add("'\ud800'")),
    "bad_escape": ("gen/add/7", _add("'\\N{NOPE}'")),
    "deep_indentation": (
        "gen/add/7",
        "```python\n"
        + "".join(" " * i + "if 1:\n" for i in range(120))
        + " " * 120
        + "pass\n```",
    ),
    "long_operator_chain": ("gen/add/7", _add("1" + "+1" * 300000)),
}  # fmt: skip


@pytest.mark.parametrize(("task_id", "reply"), list(REPLIES.values()), ids=list(REPLIES))
def test_a_reply_the_parser_refuses_never_raises(task_id: str, reply: str) -> None:
    source = {"source": "humaneval"} if task_id.startswith("HumanEval") else {}
    env = gym.make(
        "areal_agents/CodeSandbox-v0",
        sandbox_backend="process",
        tools=("python", "submit"),
        **source,
    )
    try:
        env.reset(options={"task_id": task_id})
        _, reward, *_ = env.step(reply)
    finally:
        env.close()
    assert reward == 0.0
