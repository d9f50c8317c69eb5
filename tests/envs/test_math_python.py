"""MathPython-v0: tool-integrated math with math-verify rewards, reasoning-gym tasks and
verifiers, and scripted episodes."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from areal_agents.envs import MathPythonEnv, make_env
from areal_agents.errors import ConfigError
from areal_agents.policies import ScriptedPolicy
from areal_agents.rollout import run_episode
from areal_agents.types import Message, ToolSpec


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def env_for(**kwargs: object) -> MathPythonEnv:
    kwargs.setdefault("sandbox_backend", "process")
    return MathPythonEnv(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gold", "answers"),
    [
        ("0.5", [r"\boxed{\frac{1}{2}}", r"\boxed{1/2}", r"\boxed{\dfrac{2}{4}}", r"\boxed{0.50}"]),
        ("3/4", [r"\boxed{0.75}", r"\boxed{\frac{6}{8}}", r"so \boxed{\tfrac{3}{4}}."]),
        ("1000", [r"\boxed{1000}", r"\boxed{1,000}", r"\boxed{1000.0}", r"\boxed{10^3}"]),
        (r"2\sqrt{2}", [r"\boxed{\sqrt{8}}", r"\boxed{2 \sqrt 2}"]),
        ("-7", [r"\boxed{-7}", r"\boxed{-7.0}", r"\boxed{-\frac{14}{2}}"]),
    ],
)
def test_equivalent_forms_score_one_through_the_env(gold: str, answers: list[str]) -> None:
    env = env_for()
    task = {"id": "t", "question": "?", "answer": gold}
    for answer in answers:
        env.reset(options={"task": task})
        _, reward, terminated, _, info = env.step(f"Working... {answer}")
        assert (reward, terminated) == (1.0, True), (answer, info["reward_details"])
    env.reset(options={"task": task})
    assert env.step(r"\boxed{42}")[1] == 0.0
    env.close()


def _expression(env: MathPythonEnv) -> str:
    assert env.task is not None
    return str(env.task.metadata["entry"]["metadata"]["expression"])


async def test_solver_computing_with_the_python_tool_reaches_one() -> None:
    env = env_for(datasets=("basic_arithmetic", "chain_sum"))

    def script(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        last = conversation[-1]
        if last.role == "user":
            return call("python", code=f"print({_expression(env)})")
        value = re.search(r"stdout:\n(.*)", last.content)
        assert value is not None, last.content
        return f"The result is \\boxed{{{value.group(1).strip()}}}"

    for seed in range(4):
        episode = await run_episode(env, ScriptedPolicy(script), seed=seed)
        assert episode.reward == 1.0, episode.info
        assert episode.tool_calls == 1 and episode.task_id.startswith("rg/")
    env.close()


async def test_wrong_solver_gets_zero() -> None:
    env = env_for(datasets=("basic_arithmetic",))

    def script(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        assert env.task is not None
        return f"\\boxed{{{int(float(str(env.task.answer))) + 1}}}"

    episode = await run_episode(env, ScriptedPolicy(script), seed=1)
    assert episode.reward == 0.0 and episode.info["reward_details"]["status"] == "wrong"
    env.close()


async def test_bad_tool_calls_become_observations() -> None:
    env = env_for()
    turns = iter(
        [
            call("python", code=123),
            call("calculator", expression="1+1"),
            call("python", code="import math\nprint(math.factorial(-1))"),
            "I do not know.",
        ]
    )
    seen: list[str] = []

    def script(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        seen.append(conversation[-1].content)
        return next(turns)

    episode = await run_episode(env, ScriptedPolicy(script), seed=2)
    assert "is not of type 'string'" in seen[1]
    assert "unknown tool 'calculator'" in seen[2]
    assert "ValueError" in seen[3] and seen[3].startswith("exit code 1")
    assert episode.tool_errors["invalid_arguments"] == 1
    assert episode.tool_errors["unknown_tool"] == 1
    assert episode.info["reward_details"]["status"] == "no_answer" and episode.reward == 0.0
    env.close()


async def test_running_out_of_turns() -> None:
    env = env_for(max_turns=2)
    policy = ScriptedPolicy(lambda conv, tools: call("python", code="print(1)"))
    episode = await run_episode(env, policy, seed=0)
    assert (episode.truncated, episode.terminated, episode.reward) == (True, False, 0.0)
    env.close()


def test_logic_puzzles_are_scored_by_their_own_verifier() -> None:
    env = env_for(datasets=("knights_knaves",))
    env.reset(seed=0)
    assert env.task is not None and env.task.id.startswith("rg/knights_knaves/")
    answer = env.task.answer
    assert env.step(f"<answer>{answer}</answer>")[1] == 1.0
    env.reset(seed=0)
    info = env.step("<answer>nobody knows</answer>")[4]
    assert info["reward_details"]["dataset"] == "knights_knaves"
    assert info["reward_details"]["reward"] < 1.0
    env.close()


def test_reset_is_seeded_and_task_ids_regenerate() -> None:
    env = env_for()
    obs_a, info_a = env.reset(seed=7)
    obs_b, info_b = env.reset(seed=7)
    assert obs_a == obs_b and info_a["task_id"] == info_b["task_id"]
    obs_c, _ = env.reset(options={"task_id": info_a["task_id"]})
    assert obs_c == obs_a
    env.close()


def test_user_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"id": "q1", "question": "Half of one?", "answer": "1/2"}) + "\n")
    env = env_for(source="jsonl", path=str(path))
    obs, info = env.reset(seed=0)
    assert info["task_id"] == "q1" and "Half of one?" in obs[-1]["content"]
    assert env.step(r"\boxed{0.5}")[1] == 1.0
    env.close()


def test_no_tool_variant_and_bad_configuration() -> None:
    env = env_for(tools=())
    assert env.reset(seed=0)[1]["tools"] == []
    env.close()
    with pytest.raises(ConfigError, match="verifier"):
        env_for(verifier="sympy")
    with pytest.raises(ConfigError, match="gsm_symbolic"):
        env_for(datasets=("gsm_symbolik",))
    with pytest.raises(ConfigError, match="path"):
        env_for(source="jsonl")


def test_alias() -> None:
    env = make_env("math_python", sandbox_backend="process")
    assert isinstance(env.unwrapped, MathPythonEnv)
    env.close()


@pytest.mark.docker
def test_check_env_and_python_tool_in_docker() -> None:
    env = gym.make("areal_agents/MathPython-v0", sandbox_backend="docker")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped)
        env.reset(seed=0)
        obs = env.step(call("python", code="print(2 ** 10)"))[0]
        assert obs[0]["content"] == "exit code 0\nstdout:\n1024"
    finally:
        env.close()


def test_an_exploding_answer_is_a_timeout_within_verify_timeout_s() -> None:
    import time

    from areal_agents.rewards.isolation import prewarm

    prewarm(wait=True)  # the grading process starts once per process; that is not measured
    env = env_for(verify_timeout_s=1.5)
    task = {"id": "t", "question": "?", "answer": "2"}
    for bomb in (r"9^{9^{9}}", r"100000000!", r"\frac{10^{10^{8}}+1}{10^{10^{8}}}"):
        env.reset(options={"task": task})
        start = time.monotonic()
        _, reward, terminated, _, info = env.step(f"The answer is \\boxed{{{bomb}}}")
        assert time.monotonic() - start < 1.5 + 2.5
        assert terminated and reward == 0.0 and info["reward_details"]["status"] == "timeout"
    env.reset(options={"task": task})
    assert env.step(r"\boxed{2}")[1] == 1.0  # the next answer is graded as usual
    env.close()
