"""What a metrics.jsonl line says about the batch: its staleness by episode length, and per
group the task trained on and the rewards it earned."""

from __future__ import annotations

import dataclasses

from areal_agents.trainers.data import TaskRef
from areal_agents.trainers.groups import Group
from areal_agents.trainers.step_records import (
    assistant_turns,
    staleness_by_length,
    step_metrics,
)
from areal_agents.types import Trajectory


def episode(turn_versions: list[int]) -> Trajectory:
    """An episode of one assistant turn (2 tokens) per entry, each sampled at that version, with
    a prompt token first and a tool token between turns."""
    mask, versions = [0], [-1]
    for i, v in enumerate(turn_versions):
        if i:
            mask, versions = [*mask, 0], [*versions, -1]
        mask, versions = [*mask, 1, 1], [*versions, v, v]
    n = len(mask)
    return Trajectory(
        sequence_ids=tuple(range(5, 5 + n)),
        loss_mask=tuple(mask),
        behavior_logprobs=tuple(-1.0 if m else 0.0 for m in mask),
        versions=tuple(versions),
        reward=1.0,
        group_id="g",
    )


def test_assistant_turns_are_the_runs_of_the_loss_mask() -> None:
    assert assistant_turns(episode([3, 3, 4]).loss_mask) == 3
    assert assistant_turns([1, 1, 1]) == 1 and assistant_turns([0, 0]) == 0


def test_staleness_by_length_splits_the_batch_by_turns() -> None:
    # trained at version 6: one-turn episodes sampled at 5 and 4; a 3-turn one begun at 2
    batch = [episode([5]), episode([4]), episode([2, 3, 5])]
    out = staleness_by_length(batch, trained_version=6)
    assert out == {
        "staleness/turns1_mean": 1.5,
        "batch/turns1_episodes": 2.0,
        "staleness/turns3_mean": 4.0,  # its oldest token decides
        "batch/turns3_episodes": 1.0,
    }


def test_each_group_s_task_and_rewards_are_recorded_in_batch_order() -> None:
    def group(index: int, task_id: str, rewards: list[float]) -> Group:
        trajs = [dataclasses.replace(episode([0]), reward=r, task_id=task_id) for r in rewards]
        return Group(task=TaskRef(index=index, seed=index), admitted_version=0, trajectories=trajs)

    groups = [group(4, "gen/fibonacci/7", [1.0, 1.0]), group(9, "gen/count_words/2", [0.0, 1.0])]
    line = step_metrics(1, groups, {}, {}, {"step_s": 1.0})
    assert line["batch/task_indices"] == [4, 9]
    assert line["batch/task_ids"] == ["gen/fibonacci/7", "gen/count_words/2"]
    assert line["batch/group_rewards"] == [[1.0, 1.0], [0.0, 1.0]]
