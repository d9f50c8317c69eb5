"""Rollout workers: many episodes at once on one asyncio loop, tasks drawn from the buffer.

A :class:`RolloutWorker` asks the buffer for tasks (the buffer enforces the staleness bound and
owns the task order), plays ``group_size`` episodes of each task concurrently with a token-level
policy, and hands the group back as :class:`~areal_agents.types.Trajectory` objects carrying
per-token behaviour log-probs and policy versions. An episode that hits an infrastructure fault
(:class:`~areal_agents.errors.InfrastructureError`: sandbox died, endpoint timed out after its
retries) is retried ``env.episode_retries`` times, then dropped and counted — never scored 0.

Tasks are admitted to the worker's *holder* name (``"<worker id>:<incarnation>.<pause count>/"``).
:meth:`RolloutWorker.pause` (a server died under the episodes) cancels the groups in flight and
hands their tasks back to the buffer, which admits them again, first; :meth:`RolloutWorker.resume`
continues on the servers given, under a new holder name, so that a late group of the old one
is ignored. A worker that dies has its tasks taken back by the trainer (by its id's prefix).

The class is plain Python; the trainer wraps it as a Ray actor. ``buffer`` is anything with the
coroutine methods of :class:`BufferClient`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym

from areal_agents.errors import InfrastructureError
from areal_agents.policies.base import Policy
from areal_agents.rollout import Episode, run_episode
from areal_agents.sandboxes import shutdown_sandboxes
from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.trainers.data import TaskRef, avoid_tasks
from areal_agents.trainers.env_config import EnvConfig
from areal_agents.types import Trajectory, TrajectoryMetadata

__all__ = ["BufferClient", "LocalBuffer", "RayBuffer", "RolloutWorker", "WorkerStats"]

logger = logging.getLogger(__name__)


class BufferClient(Protocol):
    """How a worker talks to the buffer (in-process or a Ray actor)."""

    async def admit(
        self, max_tasks: int, holder: str | None = None
    ) -> list[tuple[TaskRef, int]]: ...

    async def complete(
        self,
        index: int,
        trajectories: list[Trajectory],
        dropped_episodes: int,
        transcripts: list[dict[str, Any]],
        stats: dict[str, float],
        holder: str | None = None,
    ) -> str: ...

    async def requeue(self, holder_prefix: str) -> list[int]: ...

    async def closed(self) -> bool: ...


class LocalBuffer:
    """A :class:`TrajectoryBuffer` in the same process."""

    def __init__(self, buffer: TrajectoryBuffer) -> None:
        self.buffer = buffer

    async def admit(self, max_tasks: int, holder: str | None = None) -> list[tuple[TaskRef, int]]:
        return self.buffer.admit(max_tasks, holder)

    async def complete(
        self,
        index: int,
        trajectories: list[Trajectory],
        dropped_episodes: int,
        transcripts: list[dict[str, Any]],
        stats: dict[str, float],
        holder: str | None = None,
    ) -> str:
        return self.buffer.complete(
            index,
            trajectories,
            dropped_episodes=dropped_episodes,
            transcripts=transcripts,
            stats=stats,
            holder=holder,
        )

    async def requeue(self, holder_prefix: str) -> list[int]:
        return self.buffer.requeue(holder_prefix)

    async def closed(self) -> bool:
        return self.buffer.closed


class RayBuffer:
    """A :class:`TrajectoryBuffer` running as a Ray actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def admit(self, max_tasks: int, holder: str | None = None) -> list[tuple[TaskRef, int]]:
        return list(await self.handle.admit.remote(max_tasks=max_tasks, holder=holder))

    async def complete(
        self,
        index: int,
        trajectories: list[Trajectory],
        dropped_episodes: int,
        transcripts: list[dict[str, Any]],
        stats: dict[str, float],
        holder: str | None = None,
    ) -> str:
        return str(
            await self.handle.complete.remote(
                index=index,
                trajectories=trajectories,
                dropped_episodes=dropped_episodes,
                transcripts=transcripts,
                stats=stats,
                holder=holder,
            )
        )

    async def requeue(self, holder_prefix: str) -> list[int]:
        return list(await self.handle.requeue.remote(holder_prefix=holder_prefix))

    async def closed(self) -> bool:
        return bool(await self.handle.is_closed.remote())


@dataclass
class WorkerStats:
    """Counters of one worker since it started."""

    episodes: int = 0
    dropped_episodes: int = 0
    retried_episodes: int = 0
    groups: int = 0
    abandoned_groups: int = 0
    policy_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class RolloutWorker:
    """Runs groups of episodes as the buffer admits them, until the buffer closes.

    Args:
        env: the environment section of the config.
        policies: one token-level policy per inference server; episodes go round-robin.
        buffer: where tasks come from and groups go.
        max_concurrent_groups: groups in flight at once.
        worker_id: this worker's number (for logs and trajectory metadata).
        env_factory: builds an environment (default ``make_env(env.name, **env.make_kwargs())``).
        exclude_task_ids: ids of held-out tasks: a task seed that draws one is replaced by the
            next derived seed that does not (:func:`~areal_agents.trainers.data.avoid_tasks`).
        incarnation: how many times the trainer has started this worker id before (a new
            worker after a death takes tasks under a name of its own).
    """

    def __init__(
        self,
        env: EnvConfig,
        policies: Sequence[Policy],
        buffer: BufferClient,
        *,
        max_concurrent_groups: int = 4,
        worker_id: int = 0,
        env_factory: Callable[[], gym.Env[Any, Any]] | None = None,
        exclude_task_ids: Collection[str] = (),
        incarnation: int = 0,
    ) -> None:
        if not policies:
            raise ValueError("a rollout worker needs at least one policy")
        self.env_cfg = env
        self.policies = list(policies)
        self.buffer = buffer
        self.max_concurrent_groups = max_concurrent_groups
        self.worker_id = worker_id
        self._factory = env_factory or self._make_env
        self.exclude_task_ids = frozenset(exclude_task_ids)
        self._pool: list[gym.Env[Any, Any]] = []  # idle environments, reused
        self._envs: set[gym.Env[Any, Any]] = set()  # every open environment
        self._next_policy = 0
        self._stop = asyncio.Event()
        self.stats = WorkerStats()
        self.incarnation = incarnation
        self._pauses = 0
        self._paused = False
        self._running: set[asyncio.Task[None]] = set()

    @property
    def holder(self) -> str:
        """The name tasks are admitted to now (changes at every :meth:`pause`)."""
        return f"{self.worker_id}:{self.incarnation}.{self._pauses}/"

    def _make_env(self) -> gym.Env[Any, Any]:
        from areal_agents.envs.registry import make_env

        return make_env(self.env_cfg.name, **self.env_cfg.make_kwargs())

    async def run(self, poll_s: float = 0.05) -> WorkerStats:
        """Admit and run groups until the buffer closes or :meth:`stop` is called."""
        loop = asyncio.get_running_loop()
        workers = max(8, self.max_concurrent_groups * self.env_cfg.group_size * 2)
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(workers))
        running = self._running
        try:
            while not self._stop.is_set():
                if self._paused:
                    await asyncio.sleep(poll_s)
                    continue
                free = self.max_concurrent_groups - len(running)
                holder = self.holder
                admitted = await self.buffer.admit(free, holder) if free > 0 else []
                if admitted and holder != self.holder:  # paused meanwhile: hand them back
                    await self.buffer.requeue(holder)
                    continue
                for ref, version in admitted:
                    running.add(asyncio.create_task(self._group(ref, version, holder)))
                if not admitted and not running and await self.buffer.closed():
                    break
                if running:
                    done, _ = await asyncio.wait(
                        set(running), timeout=poll_s, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in done:
                        running.discard(task)
                        if not task.cancelled():
                            task.result()  # a bug in the worker must surface, not vanish
                else:
                    await asyncio.sleep(poll_s)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await asyncio.to_thread(self.close)
        return self.stats

    async def pause(self) -> list[int]:
        """Stop admitting, cancel the groups in flight and hand their tasks back to the buffer
        (which admits them again, first); returns their indices. For a server that died under
        the episodes: what they generated is lost, the tasks are not."""
        self._paused = True
        self._pauses += 1
        tasks = list(self._running)
        self._running.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.stats.abandoned_groups += len(tasks)
        return list(await self.buffer.requeue(f"{self.worker_id}:"))

    def resume(self, policies: Sequence[Policy] | None = None) -> None:
        """Admit again after :meth:`pause`, on ``policies`` when given (a restarted server)."""
        if policies is not None:
            if not policies:
                raise ValueError("a rollout worker needs at least one policy")
            self.policies = list(policies)
        self._paused = False

    def stop(self) -> None:
        """Finish soon: stop admitting and cancel what is running."""
        self._stop.set()

    def close(self) -> None:
        """Close every environment this worker made (releases their sandboxes), then whatever
        the sandbox backends still hold (the actor is killed, so no atexit runs)."""
        self._pool.clear()
        while self._envs:
            env = self._envs.pop()
            try:
                env.close()
            except Exception:  # closing is best effort; the sandbox backend reaps leftovers
                logger.warning("closing an environment failed", exc_info=True)
        try:
            shutdown_sandboxes()
        except Exception:
            logger.warning("shutting down the sandboxes failed", exc_info=True)

    async def _group(self, ref: TaskRef, version: int, holder: str | None = None) -> None:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(self._episode(ref, k) for k in range(self.env_cfg.group_size))
        )
        trajectories = [t for t, _ in results if t is not None]
        dropped = sum(1 for t, _ in results if t is None)
        transcripts = [
            e.to_json() | {"traj_id": t.metadata.traj_id}
            for t, e in results[:1]
            if t is not None and e is not None
        ]
        stats = {
            "duration_s": time.perf_counter() - start,
            "policy_tokens": float(sum(t.num_policy_tokens for t in trajectories)),
        }
        self.stats.groups += 1
        await self.buffer.complete(ref.index, trajectories, dropped, transcripts, stats, holder)

    async def _episode(self, ref: TaskRef, sample: int) -> tuple[Trajectory | None, Episode | None]:
        """One sample of task ``ref``; ``(None, None)`` when it is dropped."""
        for attempt in range(self.env_cfg.episode_retries + 1):
            env = await self._acquire()
            policy = self.policies[self._next_policy % len(self.policies)]
            self._next_policy += 1
            try:
                seed = avoid_tasks(env, ref.seed, self.exclude_task_ids)
                episode = await run_episode(env, policy, seed=seed)
            except asyncio.CancelledError:  # paused or stopped: the environment goes with it
                self._envs.discard(env)
                _close_quietly(env)
                raise
            except InfrastructureError as e:
                kind = type(e).__name__
                self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
                self.stats.retried_episodes += 1
                logger.warning(
                    "task %d sample %d attempt %d: %s: %s", ref.index, sample, attempt, kind, e
                )
                self._envs.discard(env)
                await asyncio.to_thread(_close_quietly, env)  # its sandbox may be broken
                continue
            self._pool.append(env)
            self.stats.episodes += 1
            trajectory = episode.to_trajectory(
                group_id=f"task{ref.index}",
                metadata=TrajectoryMetadata(
                    traj_id=f"{ref.index}-{sample}",
                    task_index=ref.index,
                    sample=sample,
                    attempt=attempt,
                    worker=self.worker_id,
                ),
            )
            self.stats.policy_tokens += trajectory.num_policy_tokens
            return trajectory, episode
        self.stats.dropped_episodes += 1
        return None, None

    async def _acquire(self) -> gym.Env[Any, Any]:
        if self._pool:
            return self._pool.pop()
        env = await asyncio.to_thread(self._factory)
        self._envs.add(env)
        return env


def _close_quietly(env: gym.Env[Any, Any]) -> None:
    try:
        env.close()
    except Exception:
        logger.debug("closing a broken environment failed", exc_info=True)
