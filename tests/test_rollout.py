"""The shared episode loop with scripted policies, on a built-in and a user-registered env."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import gymnasium as gym
import pytest

import areal_agents
from areal_agents.errors import UnknownEnvironmentError
from areal_agents.policies import ScriptedPolicy
from areal_agents.rollout import run_episode
from areal_agents.types import Message, ToolSpec


def calculator_solver(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    last = conversation[-1]
    if last.role == "tool":
        return f"The result is \\boxed{{{last.content}}}"
    expression = re.search(r"What is (.*)\?", conversation[-1].content)
    assert expression is not None and [t.name for t in tools] == ["calculator"]
    args = {"expression": expression.group(1)}
    return f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': args})}</tool_call>"


async def test_scripted_solver_gets_full_reward_through_the_loop() -> None:
    env = areal_agents.make_env("calculator")
    episode = await run_episode(env, ScriptedPolicy(calculator_solver), seed=5)
    assert episode.reward == 1.0 and episode.terminated and not episode.truncated
    assert episode.num_turns == 2 and episode.tool_calls == 1
    roles = [m.role for m in episode.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    # the assistant message carries the parsed call with the id the tool message answers
    assert episode.messages[2].tool_calls[0].id == episode.messages[3].tool_call_id
    transcript = episode.to_json()
    assert transcript["reward"] == 1.0 and json.dumps(transcript)


async def test_looping_policy_is_truncated_and_scored_zero() -> None:
    env = areal_agents.make_env("calculator", max_turns=3)
    looping = ScriptedPolicy(lambda c, t: '<tool_call>{"name": "calculator"}</tool_call>')
    episode = await run_episode(env, looping, seed=0)
    assert episode.truncated and not episode.terminated and episode.reward == 0.0
    assert episode.tool_errors["invalid_arguments"] == 3


async def test_user_registered_env_runs_through_the_same_loop() -> None:
    # the module:id form imports the user's module, which calls gym.register itself
    env = areal_agents.make_env("examples.custom_env.reverse_task:acme/Reverse-v0")
    assert "acme/Reverse-v0" in gym.registry

    def solver(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        if conversation[-1].role == "tool":
            return f"<answer>{conversation[-1].content}</answer>"
        word = conversation[-1].content.split(": ")[1]
        return f'<tool_call>{{"name": "reverse", "arguments": {{"text": "{word}"}}}}</tool_call>'

    episode = await run_episode(env, ScriptedPolicy(solver), seed=1)
    assert episode.reward == 1.0 and episode.num_turns == 2
    assert areal_agents.resolve_env_id("acme/Reverse-v0") == "acme/Reverse-v0"


def test_unknown_environment_names_fail_with_a_hint() -> None:
    with pytest.raises(UnknownEnvironmentError, match="did you mean 'calculator'"):
        areal_agents.make_env("calculater")
    with pytest.raises(UnknownEnvironmentError, match="not registered"):
        areal_agents.make_env("acme/Nothing-v0")


async def test_scripted_policy_turns_have_no_token_data() -> None:
    env = areal_agents.make_env("calculator")
    episode = await run_episode(env, ScriptedPolicy(calculator_solver), seed=2)
    with pytest.raises(ValueError, match="token-level policy"):
        episode.to_trajectory("g")
