"""The trajectory buffer: staleness bound, admission order, drops, filtering, checkpoint state."""

from __future__ import annotations

import json

import pytest

from areal_agents.errors import ConfigError
from areal_agents.trainers.buffer import TrajectoryBuffer, trajectory_from_dict, trajectory_to_dict
from areal_agents.trainers.data import TaskStream, task_seed
from areal_agents.types import Trajectory


def traj(index: int, sample: int, reward: float = 1.0, version: int = 0) -> Trajectory:
    return Trajectory(
        token_ids=(1, 2, 3),
        loss_mask=(0, 1, 1),
        behavior_logprobs=(0.0, -0.1, -0.2),
        versions=(-1, version, version),
        reward=reward,
        group_id=f"task{index}",
        metadata={"traj_id": f"{index}-{sample}"},
    )


def finish(buf: TrajectoryBuffer, index: int, rewards: tuple[float, ...] = (1.0, 0.0)) -> str:
    return buf.complete(index, [traj(index, k, r) for k, r in enumerate(rewards)])


def test_sync_admits_exactly_one_batch_per_version() -> None:
    buf = TrajectoryBuffer(groups_per_step=2, max_staleness=0)
    assert [r.index for r, v in buf.admit(10)] == [0, 1]
    assert buf.admit(1) == []
    finish(buf, 1)
    assert buf.pop_batch() is None  # task 0 (older) is not complete yet
    finish(buf, 0)
    batch = buf.pop_batch()
    assert batch is not None and [g.task.index for g in batch] == [0, 1]
    assert buf.admit(1) == []  # training: nothing may start before version 1 is served
    buf.set_version(1)
    assert [r.index for r, v in buf.admit(10)] == [2, 3]


@pytest.mark.parametrize("staleness", [0, 1, 3])
def test_no_trained_group_is_staler_than_the_bound(staleness: int) -> None:
    """Simulate a run: admit greedily, train as soon as possible, check every batch's age."""
    buf = TrajectoryBuffer(groups_per_step=3, max_staleness=staleness)
    admitted_at: dict[int, int] = {}
    for step in range(12):
        for ref, version in buf.admit(100):
            admitted_at[ref.index] = version
            finish(buf, ref.index)
        batch = buf.pop_batch()
        assert batch is not None
        for group in batch:
            assert step - admitted_at[group.task.index] <= staleness
            assert group.admitted_version == admitted_at[group.task.index]
        buf.set_version(step + 1)
    # async really runs ahead: with staleness s, s extra batches were admitted up front
    assert len(admitted_at) == (12 + staleness) * 3


def test_batches_follow_admission_order_whatever_the_completion_order() -> None:
    buf = TrajectoryBuffer(groups_per_step=2, max_staleness=2)
    refs = [r.index for r, _ in buf.admit(6)]
    for i in reversed(refs):
        finish(buf, i)
    order = []
    for v in range(3):
        batch = buf.pop_batch()
        assert batch is not None
        order.extend(g.task.index for g in batch)
        buf.set_version(v + 1)
    assert order == refs


def test_dropped_and_filtered_groups_release_their_slot() -> None:
    buf = TrajectoryBuffer(groups_per_step=2, max_staleness=0, dynamic_filter=True)
    buf.admit(2)
    assert buf.complete(0, [], dropped_episodes=2) == "dropped"
    assert finish(buf, 1, rewards=(1.0, 1.0)) == "filtered"
    assert [r.index for r, _ in buf.admit(5)] == [2, 3]
    finish(buf, 2)
    finish(buf, 3)
    batch = buf.pop_batch()
    assert batch is not None and [g.task.index for g in batch] == [2, 3]
    counters = buf.stats()
    assert counters["buffer/dropped_groups"] == 1
    assert counters["buffer/dropped_episodes"] == 2
    assert counters["buffer/filtered_groups"] == 1


def test_state_dict_redoes_in_flight_tasks_and_keeps_ready_groups() -> None:
    buf = TrajectoryBuffer(groups_per_step=2, max_staleness=1, data_seed=5)
    buf.admit(4)
    finish(buf, 0)
    finish(buf, 2)
    state = json.loads(json.dumps(buf.state_dict()))  # must survive JSON
    assert buf.complete(0, []) == "ignored"  # already done: an unknown index changes nothing

    again = TrajectoryBuffer(groups_per_step=2, max_staleness=1, data_seed=5)
    again.load_state_dict(state)
    assert again.pending() == [0, 1, 2, 3]
    redo = again.admit(10)
    assert [r.index for r, _ in redo] == [1, 3]  # in flight at save time: run them again
    assert [r.seed for r, _ in redo] == [task_seed(5, 1), task_seed(5, 3)]
    assert again.admit(10) == []  # cursor continues after 3, once capacity allows
    finish(again, 1)
    finish(again, 3)
    batch = again.pop_batch()
    assert batch is not None and [g.task.index for g in batch] == [0, 1]
    assert batch[0].trajectories[0].metadata["traj_id"] == "0-0"
    again.set_version(1)
    assert [r.index for r, _ in again.admit(10)] == [4, 5]


def test_trajectory_dict_round_trip() -> None:
    t = traj(3, 1, reward=0.5, version=2)
    assert trajectory_from_dict(json.loads(json.dumps(trajectory_to_dict(t)))) == t


def test_stream_is_reproducible_and_seeds_differ() -> None:
    a, b = TaskStream(1), TaskStream(1)
    seq = [a.next() for _ in range(50)]
    assert seq == [b.next() for _ in range(50)]
    assert len({r.seed for r in seq}) == 50
    assert TaskStream(2).next().seed != seq[0].seed


def test_bad_buffer_arguments() -> None:
    with pytest.raises(ConfigError, match="groups_per_step"):
        TrajectoryBuffer(groups_per_step=0, max_staleness=0)
    with pytest.raises(ConfigError, match="max_staleness"):
        TrajectoryBuffer(groups_per_step=1, max_staleness=-1)
