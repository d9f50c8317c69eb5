"""Property-based fuzzing of ``env.step`` on every built-in environment.

Random, huge, nested and non-UTF-8 actions of every type: the step never raises (other than an
:class:`~areal_agents.errors.InfrastructureError`), never hangs (pytest's time limit), and
always returns a valid observation, a float reward, bool flags and the info keys. Seeded
(``derandomize``) and bounded so that the whole suite runs in about a minute; the sandboxed
environments use the fast ``process`` backend with short tool limits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import areal_agents  # noqa: F401  (registers the built-in environments)
from areal_agents.envs import ERROR_KINDS
from areal_agents.types import ToolCall, Turn

ENVS: dict[str, tuple[dict[str, Any], int, str, str]] = {
    # id: (constructor arguments, examples, tool, its argument)
    "areal_agents/Calculator-v0": ({}, 150, "calculator", "expression"),
    "areal_agents/Search-v0": ({"kb_seed": 0}, 100, "search", "query"),
    "areal_agents/CodeSandbox-v0": (
        {"sandbox_backend": "process", "tool_timeout_s": 1, "test_timeout_s": 5},
        35,
        "python",
        "code",
    ),
    "areal_agents/MathPython-v0": (
        {"sandbox_backend": "process", "tool_timeout_s": 1, "verify_timeout_s": 2},
        35,
        "python",
        "code",
    ),
}

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=200)
FRAGMENTS = [
    "<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', "\\", " ", "\n", "```json",
    '{"name": "', '", "arguments": ', "null", "9" * 5000, "\ud800", "\x00", "\\boxed{",
    "<answer>", "</answer>", "```python\n", "def add(a, b): return ", "-", "(", "é",
]  # fmt: skip
HUGE = st.lists(
    st.tuples(st.sampled_from(FRAGMENTS), st.sampled_from([1, 3, 1000, 100_000])), max_size=5
).map(lambda parts: "".join(f * min(n, 200_000 // len(f)) for f, n in parts))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=10,
)
# a final answer whose code nests deeply (Python's own parser gives up with MemoryError)
DEEP_CODE = st.builds(
    lambda op, n, close: f"```python\ndef add(a, b):\n    return {op * n}a{close * n}\n```",
    st.sampled_from(["-", "(", "not ", "~", "["]),
    st.sampled_from([10, 1000, 100_000]),
    st.sampled_from(["", ")", "]"]),
)
CODE = st.sampled_from(["print(1)", "1/0", "import time; time.sleep(5)", "x = (", "\ud800"])


def actions(tool: str, argument: str) -> st.SearchStrategy[Any]:
    value = CODE | ANY_TEXT if argument == "code" else ANY_TEXT
    good_call = st.builds(
        lambda v: (
            f"<tool_call>{json.dumps({'name': tool, 'arguments': {argument: v}})}</tool_call>"
        ),
        value,
    )
    raw_call = st.builds(lambda body: f"<tool_call>{body}</tool_call>", JSON.map(json.dumps) | HUGE)
    tool_call = st.builds(
        ToolCall,
        st.sampled_from([tool, "", "nope", "\udc80"]) | ANY_TEXT,
        JSON.map(json.dumps) | HUGE | ANY_TEXT,
        ANY_TEXT,
    )
    function = st.fixed_dictionaries(
        {}, optional={"name": st.just(tool) | JSON, "arguments": JSON | JSON.map(json.dumps)}
    )
    entry = st.fixed_dictionaries({}, optional={"id": JSON, "function": function | JSON})
    message = st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["assistant", "user", "tool"]) | JSON,
            "content": ANY_TEXT | JSON,
            "tool_calls": st.lists(entry | JSON, max_size=3) | JSON,
        },
    )
    return st.one_of(
        ANY_TEXT,
        HUGE,
        good_call,
        st.lists(good_call | raw_call, min_size=2, max_size=12).map("".join),
        raw_call,
        st.builds(lambda t, a: t + a, ANY_TEXT, ANY_TEXT.map(lambda t: f"\\boxed{{{t}}}")),
        DEEP_CODE,
        st.builds(Turn, ANY_TEXT, st.none() | st.lists(tool_call, max_size=4).map(tuple)),
        message,
        st.none() | st.binary(max_size=50) | st.integers() | st.floats() | st.lists(JSON),
    )


@pytest.fixture(params=sorted(ENVS), scope="module")
def env_id(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def env(env_id: str) -> Iterator[gym.Env[Any, Any]]:
    env = gym.make(env_id, **ENVS[env_id][0]).unwrapped
    yield env
    env.close()


@pytest.mark.timeout(300)
def test_env_step_never_raises_or_hangs_on_any_action(env: gym.Env[Any, Any], env_id: str) -> None:
    _, examples, tool, argument = ENVS[env_id]

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.integers(0, 2**16), st.lists(actions(tool, argument), min_size=1, max_size=3))
    @example(0, ["<tool_call>" + "[" * 100_000 + "</tool_call>"])  # E1
    @example(0, ["<tool_call>{" + " " * (1 << 20) + '"name": "x"}</tool_call>'])  # E2
    @example(0, [f"```python\ndef add(a, b):\n    return {'-' * 100_000}a\n```"])
    @example(0, [None, b"\xff", {"tool_calls": "abc"}, Turn("", (ToolCall("", "{"),))])
    def episode(seed: int, steps: list[Any]) -> None:
        obs, info = env.reset(seed=seed)
        assert env.observation_space.contains(obs)
        for action in steps:
            obs, reward, terminated, truncated, info = env.step(action)
            assert env.observation_space.contains(obs), obs
            for message in obs:
                message["content"].encode("utf-8")
            assert isinstance(reward, float)
            assert isinstance(terminated, bool) and isinstance(truncated, bool)
            assert set(info["tool_errors"]) == set(ERROR_KINDS)
            if terminated or truncated:
                break

    episode()
