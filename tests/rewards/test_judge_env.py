"""``rewards.judge`` inside environments, evaluation and training: the ``judge`` keyword of every
environment, the reward it composes, and a failing judge as a dropped, counted episode.

Two scripted endpoints (``tests/policies/fake_openai.py``): the policy answers the calculator's
question; the judge answers what the test sets (``Verdicts.reply``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import areal_agents.envs  # noqa: F401  (registers the built-in ids)
from areal_agents.envs.calculator import safe_eval
from areal_agents.errors import ConfigError
from areal_agents.rewards.judge import JudgeError
from areal_agents.types import Message, ToolSpec, Turn
from tests.policies.fake_openai import FakeOpenAI

RUBRIC = "10 if the answer is stated plainly, less for padding."


class Verdicts:
    """The judge's script: ``reply`` is its whole answer; ``asked`` the responses it saw."""

    def __init__(self) -> None:
        self.reply = "SCORE: 5"
        self.asked: list[str] = []

    def __call__(self, messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
        user = messages[1]["content"]
        self.asked.append(re.search(r"<<<RESPONSE-\w+>>>\n(.*)\n<<<END", user, re.S)[1])  # type: ignore[index]
        return {"content": self.reply}


def answer(messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
    """The policy's script: the right answer to the calculator's question, boxed."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    expression = question.removeprefix("What is ").removesuffix("?")
    return {"content": f"The answer is \\boxed{{{safe_eval(expression)}}}."}


@pytest.fixture(scope="module")
def endpoints() -> Iterator[tuple[FakeOpenAI, Verdicts]]:
    verdicts = Verdicts()
    with FakeOpenAI(verdicts, model="judge").running() as server:
        yield server, verdicts


@pytest.fixture
def judge(endpoints: tuple[FakeOpenAI, Verdicts]) -> Iterator[tuple[dict[str, Any], Verdicts]]:
    server, verdicts = endpoints
    verdicts.reply, verdicts.asked[:] = "SCORE: 5", []
    server.requests.clear()
    config = {
        "base_url": server.base_url,
        "model": "judge",
        "rubric": RUBRIC,
        "api_key": "test-key",
        "max_retries": 0,
        "cache_size": 0,
    }
    yield config, verdicts


def play(config: dict[str, Any], correct: bool = True, seed: int = 0) -> tuple[float, Any]:
    env = gym.make("areal_agents/Calculator-v0", judge=config)
    _, info = env.reset(seed=seed)
    value = int(env.unwrapped.task.answer) + (0 if correct else 1)  # type: ignore[attr-defined]
    _, reward, terminated, _, info = env.step(f"\\boxed{{{value}}}")
    assert terminated
    env.close()
    return float(reward), info["reward_details"]


def test_the_reward_is_the_programs_plus_the_judges(
    judge: tuple[dict[str, Any], Verdicts],
) -> None:
    config, verdicts = judge
    reward, details = play(config)
    assert reward == 1.0 + 0.5
    assert details["status"] == "correct"
    program, verdict = details["components"]["program"], details["components"]["judge"]
    assert program == {
        "reward": 1.0,
        "status": "correct",
        "format_ok": True,
        "answer": program["answer"],
    }
    assert verdict["score"] == 5 and verdict["reward"] == 0.5 and verdict["cached"] is False
    assert verdicts.asked[-1].startswith("| \\boxed{")  # the submission, quoted
    assert play(config, correct=False)[0] == 0.0 + 0.5


def test_weight_program_weight_and_name(judge: tuple[dict[str, Any], Verdicts]) -> None:
    config, _ = judge
    assert play({**config, "program_weight": 0.0})[0] == 0.5  # the judge alone
    assert play({**config, "weight": 2.0})[0] == 1.0 + 1.0
    assert play({**config, "weight": 0.0, "program_weight": 3.0})[0] == 3.0
    _, details = play({**config, "name": "style"})
    assert set(details["components"]) == {"program", "style"}


def test_the_judge_sees_the_task_and_only_with_show_reference_its_answer(
    endpoints: tuple[FakeOpenAI, Verdicts], judge: tuple[dict[str, Any], Verdicts]
) -> None:
    server, _ = endpoints
    config, _ = judge
    play(config, seed=3)
    play({**config, "show_reference": True}, seed=3)
    hidden, shown = (r["messages"][1]["content"] for r in server.requests[-2:])
    assert "| What is " in hidden and "<<<REFERENCE" not in hidden
    assert "<<<REFERENCE" in shown


def test_episodes_share_the_judge_and_its_cache(judge: tuple[dict[str, Any], Verdicts]) -> None:
    config, verdicts = judge
    cached = {**config, "cache_size": 100}
    envs = [gym.make("areal_agents/Calculator-v0", judge=cached) for _ in range(2)]
    assert envs[0].unwrapped.judge.judge is envs[1].unwrapped.judge.judge  # type: ignore[attr-defined]
    play(cached, seed=5)
    _, details = play(cached, seed=5)  # the same task, the same answer: no second request
    assert len(verdicts.asked) == 1 and details["components"]["judge"]["cached"] is True


def test_a_judge_without_a_verdict_fails_the_step_never_scores_it(
    judge: tuple[dict[str, Any], Verdicts],
) -> None:
    config, verdicts = judge
    verdicts.reply = "Great answer!"
    with pytest.raises(JudgeError):
        play(config)


def test_a_misspelt_judge_key_fails_when_the_env_is_made(
    judge: tuple[dict[str, Any], Verdicts],
) -> None:
    config, _ = judge
    with pytest.raises(ConfigError, match="did you mean 'rubric'"):
        gym.make("areal_agents/Calculator-v0", judge={**config, "rubrik": "x"})


# ---- evaluation: python -m areal_agents.eval env_kwargs={judge: {...}} ----------------------


@pytest.mark.integration
def test_eval_adds_the_verdict_and_drops_what_the_judge_cannot_score(
    judge: tuple[dict[str, Any], Verdicts], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from areal_agents.eval import main

    config, verdicts = judge
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("AREAL_API_KEY", raising=False)
    kwargs = ", ".join(f"{k}: {v!r}" for k, v in config.items())  # cache_size: 0 among them
    with FakeOpenAI(answer).running() as policy:
        common = [
            "env=calculator",
            f"policy.base_url={policy.base_url}",
            "policy.model=scripted",
            "num_episodes=4",
            "progress=false",
            f"env_kwargs={{judge: {{{kwargs}}}}}",
        ]
        summary = main([*common, f"output_dir={tmp_path / 'scored'}"])
        assert summary["episodes"] == 4 and summary["episodes_dropped"] == 0
        assert summary["mean_reward"] == 1.5
        verdicts.reply = "I would rather not say."
        with pytest.raises(SystemExit) as stopped:  # no episode finished: exit status 1
            main([*common, f"output_dir={tmp_path / 'dropped'}"])
    assert stopped.value.code == 1
    dropped = json.loads((tmp_path / "dropped" / "summary.json").read_text())
    assert dropped["episodes_dropped"] == 4 and dropped["dropped_by_kind"] == {"JudgeError": 4}
    assert dropped["episodes"] == 0  # none was scored 0


# ---- training: python -m areal_agents.train env.kwargs.judge.*=... --------------------------


class AnswerPolicy:
    """A token-level fake policy: the right answer, boxed, with made-up token data."""

    async def act(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> Turn:
        expression = conversation[-1].content.removeprefix("What is ").removesuffix("?")
        await asyncio.sleep(0)
        return Turn(
            text=f"\\boxed{{{safe_eval(expression)}}}",
            completion_ids=(7, 8),
            behavior_logprobs=(-0.5, -0.25),
            versions=(0, 0),
            prompt_ids=(1, 2, 3),
            finish_reason="stop",
        )


def test_train_overrides_reach_the_rollouts_and_a_failing_judge_drops_them(
    judge: tuple[dict[str, Any], Verdicts],
) -> None:
    from areal_agents.config import load_config
    from areal_agents.trainers.buffer import TrajectoryBuffer
    from areal_agents.trainers.config import TrainConfig
    from areal_agents.trainers.rollout_worker import LocalBuffer, RolloutWorker

    config, verdicts = judge
    overrides = [
        f"env.kwargs.judge.{k}={v!r}" if isinstance(v, str) else f"env.kwargs.judge.{k}={v}"
        for k, v in config.items()
    ]
    cfg = load_config(
        TrainConfig, ["env=calculator", "env.group_size=2", "env.episode_retries=1", *overrides]
    )
    assert cfg.env.kwargs["judge"] == config

    def rollouts() -> tuple[TrajectoryBuffer, RolloutWorker]:
        buffer = TrajectoryBuffer(groups_per_step=1, max_staleness=0)
        worker = RolloutWorker(
            cfg.env, [AnswerPolicy()], LocalBuffer(buffer), max_concurrent_groups=1
        )

        async def run() -> None:
            task = asyncio.create_task(worker.run(poll_s=0.01))
            while buffer.stats()["buffer/ready"] + buffer.counters["dropped_groups"] < 1:
                await asyncio.sleep(0.01)
            buffer.close()
            await asyncio.wait_for(task, 30)

        asyncio.run(run())
        return buffer, worker

    buffer, _ = rollouts()
    batch = buffer.pop_batch()
    assert batch is not None and [t.reward for t in batch[0].trajectories] == [1.5, 1.5]
    verdicts.reply = "no verdict"
    buffer, worker = rollouts()
    groups = buffer.counters[
        "dropped_groups"
    ]  # (the buffer admits a task in a dropped one's place)
    assert groups >= 1 and buffer.counters["dropped_episodes"] == 2 * groups
    assert worker.stats.dropped_episodes == 2 * groups and worker.stats.episodes == 0
    assert worker.stats.errors == {"JudgeError": 4 * groups}  # 2 samples x (1 try + 1 retry)
    assert buffer.pop_batch() is None  # nothing was scored 0 in their place
