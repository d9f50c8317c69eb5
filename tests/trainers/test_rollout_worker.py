"""Rollout workers: groups per task, retries, dropped episodes never scored, environments closed.

The policy here is an honest fake: it answers the calculator env's task with fixed token ids
(no model), and raises the same typed error a token client raises when an endpoint times out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from areal_agents.envs.registry import make_env
from areal_agents.errors import EndpointError
from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.trainers.config import EnvConfig
from areal_agents.trainers.rollout_worker import LocalBuffer, RolloutWorker
from areal_agents.types import Message, ToolSpec, Turn


class AnswerPolicy:
    """Boxes the right answer (read off the user prompt); fails on the prompts it is told to."""

    def __init__(
        self, fail_on: frozenset[str] | set[str] = frozenset(), fail_times: int = 99
    ) -> None:
        self.fail_on = fail_on
        self.fail_times = fail_times
        self.failures = 0

    async def act(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> Turn:
        prompt = conversation[-1].content
        if prompt in self.fail_on and self.failures < self.fail_times:
            self.failures += 1
            raise EndpointError("completion timed out after 4 retries")
        expression = prompt.removeprefix("What is ").removesuffix("?")
        value = eval(expression)  # the env's own integer arithmetic
        await asyncio.sleep(0)
        return Turn(
            text=f"\\boxed{{{value}}}",
            completion_ids=(7, 8, 9),
            behavior_logprobs=(-0.5, -0.25, -0.125),
            versions=(3, 3, 4),
            prompt_ids=(1, 2, 3, 4),
            finish_reason="stop",
        )


class CountingEnvs:
    def __init__(self) -> None:
        self.made: list[Any] = []

    def __call__(self) -> Any:
        env = make_env("calculator")
        self.made.append(env)
        return env


def run(worker: RolloutWorker, buffer: TrajectoryBuffer, groups: int) -> None:
    async def main() -> None:
        task = asyncio.create_task(worker.run(poll_s=0.01))
        while buffer.stats()["buffer/ready"] + buffer.counters["dropped_groups"] < groups:
            await asyncio.sleep(0.01)
        buffer.close()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())


def prompt_of(buffer_seed: int, index: int) -> str:
    from areal_agents.trainers.data import task_seed

    env = make_env("calculator")
    obs, _ = env.reset(seed=task_seed(buffer_seed, index))
    return obs[-1]["content"]


def test_groups_share_a_task_and_carry_token_data() -> None:
    buffer = TrajectoryBuffer(groups_per_step=2, max_staleness=0)
    envs = CountingEnvs()
    worker = RolloutWorker(
        EnvConfig(name="calculator", group_size=3),
        [AnswerPolicy()],
        LocalBuffer(buffer),
        max_concurrent_groups=2,
        env_factory=envs,
    )
    run(worker, buffer, groups=2)
    batch = buffer.pop_batch()
    assert batch is not None
    for group in batch:
        assert len(group.trajectories) == 3
        assert len({t.task_id for t in group.trajectories}) == 1  # one task per group
        assert {t.group_id for t in group.trajectories} == {f"task{group.task.index}"}
        assert [t.metadata.traj_id for t in group.trajectories] == [
            f"{group.task.index}-{k}" for k in range(3)
        ]
        t = group.trajectories[0]
        assert t.reward == 1.0
        assert t.loss_mask == (0, 0, 0, 0, 1, 1, 1)
        assert t.behavior_logprobs[-3:] == (-0.5, -0.25, -0.125)
        assert t.min_version == 3
        assert group.transcripts and group.transcripts[0]["traj_id"] == f"{group.task.index}-0"
    assert worker.stats.episodes == 6
    assert len(envs.made) <= 6  # environments are reused across episodes
    assert not worker._envs  # and all closed when the worker stops


def test_broken_episodes_are_retried_then_dropped_never_scored() -> None:
    buffer = TrajectoryBuffer(groups_per_step=2, max_staleness=0, data_seed=3)
    doomed = prompt_of(3, 1)  # every sample of task 1 fails, on every attempt
    policy = AnswerPolicy(fail_on={doomed})
    worker = RolloutWorker(
        EnvConfig(name="calculator", group_size=2, episode_retries=1),
        [policy],
        LocalBuffer(buffer),
        max_concurrent_groups=2,
    )
    run(worker, buffer, groups=2)
    assert buffer.counters["dropped_groups"] == 1
    assert buffer.counters["dropped_episodes"] == 2
    assert worker.stats.dropped_episodes == 2
    assert worker.stats.errors == {"EndpointError": 4}  # 2 samples x (1 try + 1 retry)
    assert policy.failures == 4
    # the dropped task left no trajectory with reward 0 behind: only task 0 is ready
    assert buffer.pending()[:1] == [0] and 1 not in buffer.pending()


def test_a_retry_that_succeeds_keeps_the_episode() -> None:
    buffer = TrajectoryBuffer(groups_per_step=1, max_staleness=0, data_seed=4)
    policy = AnswerPolicy(fail_on={prompt_of(4, 0)}, fail_times=1)
    worker = RolloutWorker(
        EnvConfig(name="calculator", group_size=2, episode_retries=1),
        [policy],
        LocalBuffer(buffer),
        max_concurrent_groups=1,
    )
    run(worker, buffer, groups=1)
    batch = buffer.pop_batch()
    assert batch is not None and len(batch[0].trajectories) == 2
    assert sorted(t.metadata.attempt for t in batch[0].trajectories) == [0, 1]
    assert buffer.counters["dropped_episodes"] == 0
