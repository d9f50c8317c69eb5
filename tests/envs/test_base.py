"""MultiTurnEnv: the Gymnasium contract on every registered id, and the model's mistakes as
observations (never exceptions)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import areal_agents  # noqa: F401  (registers the built-in environments)
from areal_agents.envs import CalculatorEnv, MultiTurnEnv, Score, Task
from areal_agents.errors import SandboxError
from areal_agents.tools import FunctionTool, Tool
from areal_agents.types import ToolCall, Turn

BUILTIN_IDS = sorted(i for i in gym.registry if i.startswith("areal_agents/"))


def _fast_kwargs(env_id: str) -> dict[str, object]:
    # Sandboxed environments run check_env on the plain process backend unless docker is the
    # point of the test; the env ids themselves are the same.
    if env_id in ("areal_agents/CodeSandbox-v0", "areal_agents/MathPython-v0"):
        return {"sandbox_backend": "process"}
    return {}


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_check_env_passes_on_every_builtin_id_without_warnings(env_id: str) -> None:
    assert BUILTIN_IDS, "no environments registered"
    env = gym.make(env_id, **_fast_kwargs(env_id))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped)
    finally:
        env.close()


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


MALFORMED = [
    ("<tool_call>{not json}</tool_call>", "parse", "could not parse"),
    ("<tool_call>[1, 2]</tool_call>", "parse", "JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', "parse", '"name"'),
    ('<tool_call>{"name": "calculator", "arguments": {"expr', "parse", "invalid JSON"),
    (call("rm_rf"), "unknown_tool", "unknown tool 'rm_rf'"),
    (call("calculator"), "invalid_arguments", "missing required argument 'expression'"),
    (call("calculator", expression=12), "invalid_arguments", "is not of type 'string'"),
    (call("calculator", expression="1", extra=2), "invalid_arguments", "unknown argument"),
    ('<tool_call>{"name": "calculator", "arguments": "[1]"}</tool_call>', "invalid_arguments", ""),
    (call("calculator", expression="__import__('os')"), "tool_failure", "unsupported syntax"),
    (call("calculator", expression="1 // 0"), "tool_failure", "division by zero"),
    (call("calculator", expression="1 +"), "tool_failure", "cannot parse"),
]


@pytest.mark.parametrize(("text", "kind", "needle"), MALFORMED)
def test_malformed_tool_calls_become_error_observations(text: str, kind: str, needle: str) -> None:
    env = CalculatorEnv(max_turns=4)
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(text)
    assert not terminated and not truncated and reward == 0.0
    assert len(obs) == 1 and obs[0]["content"].startswith("Error")
    assert needle in obs[0]["content"]
    assert info["tool_errors"][kind] == 1
    assert sum(info["tool_errors"].values()) == 1
    # the episode goes on: a correct call and answer still work
    expression = env.task.metadata["expression"]  # type: ignore[union-attr]
    obs, *_ = env.step(call("calculator", expression=expression))
    assert obs[0]["role"] == "tool" and obs[0]["content"] == str(env.task.answer)  # type: ignore[union-attr]
    _, reward, terminated, _, info = env.step(f"\\boxed{{{obs[0]['content']}}}")
    assert terminated and reward == 1.0
    assert info["tool_errors"][kind] == 1  # cumulative over the episode


def test_random_actions_never_raise() -> None:
    env = CalculatorEnv(max_turns=3)
    env.action_space.seed(0)
    for episode in range(40):
        env.reset(seed=episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated


def test_structured_tool_calls_and_several_calls_per_turn() -> None:
    env = CalculatorEnv()
    env.reset(seed=3)
    turn = Turn(
        text="",
        tool_calls=(
            ToolCall("calculator", '{"expression": "2*3"}', id="a"),
            ToolCall("calculator", '{"expression": "7-9"}', id="b"),
        ),
    )
    obs, *_ = env.step(turn)
    assert [(m["tool_call_id"], m["content"]) for m in obs] == [("a", "6"), ("b", "-2")]
    # an OpenAI assistant message dict is accepted as the action too
    obs, *_ = env.step(
        {
            "content": "",
            "tool_calls": [
                {
                    "id": "c",
                    "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'},
                }
            ],
        }
    )
    assert obs[0]["tool_call_id"] == "c" and obs[0]["content"] == "2"


def test_max_turns_truncates_and_step_after_end_needs_reset() -> None:
    env = CalculatorEnv(max_turns=2)
    env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step(call("calculator", expression="1+1"))
    assert not terminated and not truncated
    _, reward, terminated, truncated, info = env.step(call("calculator", expression="1+2"))
    assert truncated and not terminated and reward == 0.0 and info["outcome"] == "max_turns"
    with pytest.raises(gym.error.ResetNeeded):
        env.step("more")


def test_wrong_answer_and_missing_answer_score_zero() -> None:
    env = CalculatorEnv()
    env.reset(seed=0)
    wrong = int(env.task.answer) + 1  # type: ignore[union-attr]
    _, reward, terminated, _, info = env.step(f"\\boxed{{{wrong}}}")
    assert terminated and reward == 0.0 and info["reward_details"]["format_ok"] is True
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("I think it is big.")
    assert terminated and reward == 0.0 and info["reward_details"]["format_ok"] is False


def test_reset_options_task_and_seed_determinism() -> None:
    env = CalculatorEnv()
    obs, info = env.reset(options={"task": {"id": "t1", "prompt": "What is 2+2?", "answer": 4}})
    assert info["task_id"] == "t1" and obs[-1]["content"] == "What is 2+2?"
    a, _ = env.reset(seed=42)
    b, _ = env.reset(seed=42)
    c, _ = env.reset(seed=43)
    assert a == b and a != c


def test_render_ansi_shows_the_conversation() -> None:
    env = CalculatorEnv(render_mode="ansi")
    env.reset(seed=0)
    env.step(call("calculator", expression="2+2"))
    text = env.render()
    assert text is not None and "[user] What is" in text and "-> calculator" in text
    assert "[tool] 4" in text


class _Broken(MultiTurnEnv):
    def make_tools(self, task: Task | None) -> Sequence[Tool]:
        def boom() -> str:
            raise SandboxError("container vanished")

        return (FunctionTool(boom, "boom", "fails", {"type": "object", "properties": {}}),)

    def sample_task(self, rng: np.random.Generator) -> Task:
        return Task("t", "go")

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        return Score(0.0)


def test_infrastructure_faults_propagate_instead_of_becoming_observations() -> None:
    env = _Broken()
    env.reset(seed=0)
    with pytest.raises(SandboxError):
        env.step(call("boom"))


def test_tool_output_is_capped() -> None:
    env = CalculatorEnv(max_tool_output_chars=5)
    env.reset(seed=0)
    obs, *_ = env.step(call("calculator", expression="99999999*99999999"))
    assert obs[0]["content"].startswith("99999") and "[truncated" in obs[0]["content"]


class _ToolsReturn(MultiTurnEnv):
    """An environment whose ``make_tools`` returns whatever the test sets."""

    tools: object = None

    def make_tools(self, task: Task | None) -> Sequence[Tool]:
        return self.tools  # type: ignore[return-value]

    def sample_task(self, rng: np.random.Generator) -> Task:
        return Task(id="t", prompt="p", answer="a")

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        return Score(1.0)


@pytest.mark.parametrize(
    ("tools", "said"),
    [(None, "returned NoneType"), (42, "returned int"), (["upper"], "'upper'")],
)
def test_make_tools_must_return_tools_and_the_error_names_the_method(
    tools: object, said: str
) -> None:
    from areal_agents.errors import ConfigError

    class Env(_ToolsReturn):
        pass

    Env.tools = tools
    with pytest.raises(ConfigError, match=r"Env\.make_tools\(None\)") as info:
        Env()
    assert said in str(info.value)


def test_make_tools_may_return_an_empty_list() -> None:
    class Env(_ToolsReturn):
        pass

    Env.tools = []
    obs, info = Env().reset(seed=0)
    assert obs[-1]["content"] == "p" and info["tools"] == []
