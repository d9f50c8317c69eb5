"""The trajectory buffer: admission under a staleness bound, and batches in admission order.

Rollout workers ask :meth:`TrajectoryBuffer.admit` for tasks and hand back whole groups with
:meth:`TrajectoryBuffer.complete`; the learner takes :meth:`TrajectoryBuffer.pop_batch`.

**Staleness bound** (as in AReaL). With ``G`` groups per training step, weights of version ``v``
on the inference servers and bound ``max_staleness`` (``η``), a new task is admitted only while
``trained + in_flight + ready < (v + η + 1) * G``. A group admitted under version ``v`` sits at
a position below ``(v + η + 1) * G``, so it is trained at step ``v + η`` at the latest: no token
is more than ``η`` versions older than the weights it trains. ``η = 0`` is synchronous training
(nothing is admitted while the learner works). Dropped and filtered groups release their slot.

**Order**: a batch is always the ``G`` oldest admitted groups that are still usable, taken only
once every one of them is complete. Batches therefore do not depend on which episode finished
first, which is what makes a resumed run train exactly the same groups as an uninterrupted one.

The class is plain Python (tests use it directly); the trainer wraps it as a Ray actor.

>>> buf = TrajectoryBuffer(groups_per_step=2, max_staleness=0)
>>> [ref.index for ref, _ in buf.admit(8)]
[0, 1]
>>> buf.admit(1)  # full until the learner consumes a batch and version 1 is pushed
[]
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_agents.errors import ConfigError
from areal_agents.trainers.data import TaskRef, TaskStream
from areal_agents.types import Trajectory

__all__ = ["Group", "TrajectoryBuffer", "trajectory_from_dict", "trajectory_to_dict"]


@dataclass
class Group:
    """All usable samples of one task, plus what the rollout recorded about them."""

    task: TaskRef
    admitted_version: int
    trajectories: list[Trajectory]
    dropped_episodes: int = 0
    transcripts: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": {"index": self.task.index, "seed": self.task.seed},
            "admitted_version": self.admitted_version,
            "trajectories": [trajectory_to_dict(t) for t in self.trajectories],
            "dropped_episodes": self.dropped_episodes,
            "transcripts": self.transcripts,
            "stats": self.stats,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Group:
        return cls(
            task=TaskRef(int(data["task"]["index"]), int(data["task"]["seed"])),
            admitted_version=int(data["admitted_version"]),
            trajectories=[trajectory_from_dict(t) for t in data["trajectories"]],
            dropped_episodes=int(data.get("dropped_episodes", 0)),
            transcripts=list(data.get("transcripts", [])),
            stats=dict(data.get("stats", {})),
        )


def trajectory_to_dict(traj: Trajectory) -> dict[str, Any]:
    """A JSON-able dict of a trajectory (metadata must be JSON-able too)."""
    return {
        "token_ids": list(traj.token_ids),
        "loss_mask": list(traj.loss_mask),
        "behavior_logprobs": list(traj.behavior_logprobs),
        "versions": list(traj.versions),
        "reward": traj.reward,
        "group_id": traj.group_id,
        "task_id": traj.task_id,
        "num_turns": traj.num_turns,
        "terminated": traj.terminated,
        "truncated": traj.truncated,
        "metadata": dict(traj.metadata),
    }


def trajectory_from_dict(data: Mapping[str, Any]) -> Trajectory:
    """The inverse of :func:`trajectory_to_dict`."""
    return Trajectory(
        token_ids=tuple(data["token_ids"]),
        loss_mask=tuple(data["loss_mask"]),
        behavior_logprobs=tuple(data["behavior_logprobs"]),
        versions=tuple(data["versions"]),
        reward=float(data["reward"]),
        group_id=str(data["group_id"]),
        task_id=str(data.get("task_id", "")),
        num_turns=int(data.get("num_turns", 0)),
        terminated=bool(data.get("terminated", True)),
        truncated=bool(data.get("truncated", False)),
        metadata=dict(data.get("metadata", {})),
    )


class TrajectoryBuffer:
    """Staleness-bounded, order-preserving store of completed groups.

    Args:
        groups_per_step: tasks (groups) in one training batch.
        max_staleness: how many versions behind the trained weights a token may be.
        data_seed: seed of the task stream.
        dynamic_filter: drop groups whose rewards are all equal (no learning signal).
    """

    def __init__(
        self,
        groups_per_step: int,
        max_staleness: int,
        *,
        data_seed: int = 0,
        dynamic_filter: bool = False,
    ) -> None:
        if groups_per_step < 1:
            raise ConfigError(f"groups_per_step={groups_per_step}: must be at least 1")
        if max_staleness < 0:
            raise ConfigError(f"max_staleness={max_staleness}: must be 0 or more")
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.dynamic_filter = dynamic_filter
        self.stream = TaskStream(data_seed)
        self.version = 0
        self.trained_groups = 0
        self.closed = False
        self._redo: list[TaskRef] = []  # in flight at the last checkpoint: run these first
        self._inflight: dict[int, tuple[TaskRef, int]] = {}
        self._ready: dict[int, Group] = {}
        self.counters: dict[str, int] = {
            "dropped_episodes": 0,
            "dropped_groups": 0,
            "filtered_groups": 0,
            "admitted_groups": 0,
        }

    # ---- admission -------------------------------------------------------------------------

    def capacity(self) -> int:
        """How many more tasks may start now without breaking the staleness bound."""
        limit = (self.version + self.max_staleness + 1) * self.groups_per_step
        used = self.trained_groups + len(self._inflight) + len(self._ready)
        return max(0, limit - used)

    def admit(self, max_tasks: int = 1) -> list[tuple[TaskRef, int]]:
        """Up to ``max_tasks`` tasks to start now, each with the server version it starts under."""
        if self.closed:
            return []
        out: list[tuple[TaskRef, int]] = []
        for _ in range(min(max_tasks, self.capacity())):
            ref = self._redo.pop(0) if self._redo else self.stream.next()
            self._inflight[ref.index] = (ref, self.version)
            self.counters["admitted_groups"] += 1
            out.append((ref, self.version))
        return out

    def complete(
        self,
        index: int,
        trajectories: Sequence[Trajectory],
        *,
        dropped_episodes: int = 0,
        transcripts: Sequence[dict[str, Any]] = (),
        stats: Mapping[str, float] | None = None,
    ) -> str:
        """Hand back the finished group of task ``index``; returns "ready", "dropped" or
        "filtered" (an unknown index — e.g. a task from before a restart — is "ignored")."""
        entry = self._inflight.pop(index, None)
        if entry is None:
            return "ignored"
        ref, version = entry
        self.counters["dropped_episodes"] += dropped_episodes
        if not trajectories:
            self.counters["dropped_groups"] += 1
            return "dropped"
        rewards = [t.reward for t in trajectories]
        if self.dynamic_filter and len(set(rewards)) == 1:
            self.counters["filtered_groups"] += 1
            return "filtered"
        self._ready[index] = Group(
            task=ref,
            admitted_version=version,
            trajectories=list(trajectories),
            dropped_episodes=dropped_episodes,
            transcripts=list(transcripts),
            stats=dict(stats or {}),
        )
        return "ready"

    # ---- consumption -----------------------------------------------------------------------

    def pending(self) -> list[int]:
        """Indices admitted and not yet trained, dropped or filtered (oldest first)."""
        redo = [r.index for r in self._redo]
        return sorted([*self._inflight, *self._ready, *redo])

    def pop_batch(self) -> list[Group] | None:
        """The next batch (the oldest ``G`` usable groups) once all are complete, else None."""
        head = self.pending()[: self.groups_per_step]
        if len(head) < self.groups_per_step or any(i not in self._ready for i in head):
            return None
        self.trained_groups += self.groups_per_step
        return [self._ready.pop(i) for i in head]

    def set_version(self, version: int) -> None:
        """Record the weight version now served by every inference server."""
        self.version = int(version)

    def close(self) -> None:
        """Admit nothing more (the run is ending)."""
        self.closed = True

    def is_closed(self) -> bool:
        return self.closed

    def stats(self) -> dict[str, float]:
        """Gauges for the progress bar and the metrics file."""
        ready = list(self._ready.values())
        return {
            "buffer/in_flight": float(len(self._inflight)),
            "buffer/ready": float(len(ready)),
            "buffer/capacity": float(self.capacity()),
            "buffer/cursor": float(self.stream.cursor),
            "buffer/ready_age_mean": (
                statistics.fmean(self.version - g.admitted_version for g in ready) if ready else 0.0
            ),
            **{f"buffer/{k}": float(v) for k, v in self.counters.items()},
        }

    # ---- checkpointing ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: cursor, in-flight tasks and ready groups.

        In-flight tasks are saved as "to redo": their partial episodes die with the process,
        so a resumed run starts them again (they were never trained, so this repeats nothing).
        """
        redo = sorted([*self._redo, *(ref for ref, _ in self._inflight.values())])
        return {
            "stream": self.stream.state_dict(),
            "version": self.version,
            "trained_groups": self.trained_groups,
            "redo": [{"index": r.index, "seed": r.seed} for r in redo],
            "ready": [self._ready[i].to_dict() for i in sorted(self._ready)],
            "counters": dict(self.counters),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.stream.load_state_dict(dict(state["stream"]))
        self.version = int(state["version"])
        self.trained_groups = int(state["trained_groups"])
        self._redo = [TaskRef(int(r["index"]), int(r["seed"])) for r in state["redo"]]
        self._inflight = {}
        self._ready = {int(g["task"]["index"]): Group.from_dict(g) for g in state["ready"]}
        self.counters.update({k: int(v) for k, v in state.get("counters", {}).items()})
