"""Tool-call health while training: real calculator episodes, played by a rollout worker into a
real buffer, go through the metrics the trainer records each step, then to TensorBoard and the
progress bar.

The policy is an honest fake: it makes the same tool-call mistakes on every episode (one
unparseable call, then an unknown tool, bad arguments and one good call, then the answer),
and fails with the endpoint-timeout error of a token client on the prompts it is told to, so
those episodes are dropped. Its "tokenizer" gives each assistant message the token ids that
were sampled for it and one token to any other message, so the turns join into a trajectory
the way a token client's do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from areal_agents.envs.base import ERROR_KINDS
from areal_agents.errors import EndpointError
from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.trainers.config import EnvConfig, LogConfig
from areal_agents.trainers.metrics import MetricsLogger, health_metrics, progress_postfix
from areal_agents.trainers.rollout_worker import LocalBuffer, RolloutWorker
from areal_agents.types import Message, ToolCall, ToolSpec, Turn

SAMPLED = (7, 8, 9)  # the token ids of every assistant turn


def encode(conversation: Sequence[Message]) -> tuple[int, ...]:
    out: list[int] = []
    for m in conversation:
        out.extend(SAMPLED if m.role == "assistant" else (1,))
    return tuple(out)


class ClumsyPolicy:
    """Three turns per episode with four tool-call mistakes; fails on ``fail_on`` prompts."""

    def __init__(self, fail_on: frozenset[str] = frozenset()) -> None:
        self.fail_on = fail_on

    async def act(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> Turn:
        prompt = next(m.content for m in conversation if m.role == "user")
        if prompt in self.fail_on:
            raise EndpointError("completion timed out after 4 retries")
        expression = prompt.removeprefix("What is ").removesuffix("?")
        turn = sum(1 for m in conversation if m.role == "assistant")
        await asyncio.sleep(0)
        if turn == 0:  # text the environment cannot parse as a call
            text, calls = "<tool_call>{not json</tool_call>", None
        elif turn == 1:  # an unknown tool, arguments the schema refuses, and one good call
            text = ""
            calls = (
                ToolCall("abacus", json.dumps({"expression": expression})),
                ToolCall("calculator", json.dumps({"formula": expression})),
                ToolCall("calculator", json.dumps({"expression": expression})),
            )
        else:
            text, calls = f"\\boxed{{{eval(expression)}}}", None
        return Turn(
            text=text,
            tool_calls=calls,
            completion_ids=SAMPLED,
            behavior_logprobs=(-0.5, -0.25, -0.125),
            versions=(0, 0, 0),
            prompt_ids=encode(conversation),
            finish_reason="stop",
        )


def prompt_of(buffer_seed: int, index: int) -> str:
    from areal_agents.envs.registry import make_env
    from areal_agents.trainers.data import task_seed

    env = make_env("calculator")
    obs, _ = env.reset(seed=task_seed(buffer_seed, index))
    env.close()
    return str(obs[-1]["content"])


def play_one_step(fail_task: int | None) -> tuple[dict[str, float], list, dict, dict]:
    """Episodes for one step of 2 groups x 2 samples; returns health metrics and the batch."""
    buffer = TrajectoryBuffer(groups_per_step=2, max_staleness=0, data_seed=5)
    doomed = frozenset() if fail_task is None else frozenset({prompt_of(5, fail_task)})
    worker = RolloutWorker(
        EnvConfig(name="calculator", group_size=2, episode_retries=1),
        [ClumsyPolicy(doomed)],
        LocalBuffer(buffer),
        max_concurrent_groups=2,
    )
    before = buffer.stats()

    async def main() -> None:
        task = asyncio.create_task(worker.run(poll_s=0.01))
        while buffer.stats()["buffer/ready"] < 2:
            await asyncio.sleep(0.01)
        buffer.close()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    batch = buffer.pop_batch()
    assert batch is not None
    trajectories = [t for g in batch for t in g.trajectories]
    after = buffer.stats()
    return health_metrics(trajectories, before, after), trajectories, before, after


def test_real_episodes_give_per_kind_rates_turns_and_the_dropped_share() -> None:
    health, trajectories, _, after = play_one_step(fail_task=1)
    assert len(trajectories) == 4 and all(t.num_turns == 3 for t in trajectories)
    # per episode: 3 calls run (unknown, bad arguments, good) + 1 unparseable = 4 attempts
    assert health["tools/calls_per_episode"] == 3.0
    assert health["tools/error_rate"] == pytest.approx(3 / 4)
    for kind in ("parse", "unknown_tool", "invalid_arguments"):
        assert health[f"tools/error_rate/{kind}"] == pytest.approx(1 / 4)
    for kind in ("tool_failure", "too_many_calls", "time_budget"):
        assert health[f"tools/error_rate/{kind}"] == 0.0  # present, so the curve is continuous
    assert {f"tools/error_rate/{k}" for k in ERROR_KINDS} <= set(health)
    assert health["episode/turns_mean"] == 3.0 and health["episode/turns_max"] == 3.0
    # task 1's two samples failed on both attempts: 2 dropped, 4 finished (tasks 0 and 2)
    assert after["buffer/dropped_episodes"] == 2 and after["buffer/finished_episodes"] == 4
    assert health["episode/dropped"] == 2.0
    assert health["episode/dropped_frac"] == pytest.approx(2 / 6)


def test_no_drops_no_dropped_share_and_deltas_not_totals() -> None:
    health, trajectories, _, after = play_one_step(fail_task=None)
    assert health["episode/dropped"] == 0.0 and health["episode/dropped_frac"] == 0.0
    # the next step counts only what happened since this one
    later = dict(after, **{"buffer/finished_episodes": after["buffer/finished_episodes"] + 3})
    later["buffer/dropped_episodes"] = after["buffer/dropped_episodes"] + 1
    assert health_metrics(trajectories, after, later)["episode/dropped_frac"] == 0.25


def test_tensorboard_and_progress_bar_get_them(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    health, _, _, _ = play_one_step(fail_task=1)
    metrics = {"reward/mean": 1.0, "throughput/tokens_per_s": 20.0, "staleness/max": 0, **health}
    log = MetricsLogger(tmp_path, LogConfig(tensorboard=True))
    log.log(1, metrics)
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for kind in ERROR_KINDS:
        assert f"tools/error_rate/{kind}" in scalars
    for key in ("episode/dropped_frac", "episode/turns_mean", "tools/error_rate/parse"):
        (event,) = events.Scalars(key)
        assert event.step == 1 and event.value == pytest.approx(health[key])
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["episode/dropped_frac"] == pytest.approx(1 / 3)

    postfix = progress_postfix(metrics)
    assert postfix["tool_err"] == "0.75" and postfix["dropped"] == "0.33"
    assert postfix["parse"] == postfix["unknown_tool"] == postfix["bad_args"] == "0.25"
    assert "tool_fail" not in postfix and "timeout" not in postfix  # zero: left off


def test_a_clean_step_keeps_the_progress_bar_short() -> None:
    metrics = {"reward/mean": 0.5, "throughput/tokens_per_s": 3.0, "staleness/max": 1}
    metrics |= {f"tools/error_rate/{k}": 0.0 for k in ERROR_KINDS}
    metrics |= {"tools/error_rate": 0.0, "episode/dropped_frac": 0.0}
    assert progress_postfix(metrics) == {"reward": "0.500", "tok_s": "3.0", "stale": 1}
