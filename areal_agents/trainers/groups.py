"""A group of trajectories (one task's samples) and its JSON form, as checkpoints keep it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_agents.trainers.data import TaskRef
from areal_agents.types import Trajectory, TrajectoryMetadata

__all__ = ["Group", "trajectory_from_dict", "trajectory_to_dict"]


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
    """A JSON-able dict of a trajectory."""
    return {
        "sequence_ids": list(traj.sequence_ids),
        "loss_mask": list(traj.loss_mask),
        "behavior_logprobs": list(traj.behavior_logprobs),
        "versions": list(traj.versions),
        "reward": traj.reward,
        "group_id": traj.group_id,
        "task_id": traj.task_id,
        "num_turns": traj.num_turns,
        "terminated": traj.terminated,
        "truncated": traj.truncated,
        "metadata": traj.metadata.to_dict(),
    }


def trajectory_from_dict(data: Mapping[str, Any]) -> Trajectory:
    """The inverse of :func:`trajectory_to_dict`."""
    return Trajectory(
        # "token_ids": checkpoints written before the field was named sequence_ids
        sequence_ids=tuple(data["sequence_ids"] if "sequence_ids" in data else data["token_ids"]),
        loss_mask=tuple(data["loss_mask"]),
        behavior_logprobs=tuple(data["behavior_logprobs"]),
        versions=tuple(data["versions"]),
        reward=float(data["reward"]),
        group_id=str(data["group_id"]),
        task_id=str(data.get("task_id", "")),
        num_turns=int(data.get("num_turns", 0)),
        terminated=bool(data.get("terminated", True)),
        truncated=bool(data.get("truncated", False)),
        metadata=TrajectoryMetadata.from_dict(data.get("metadata", {})),
    )
