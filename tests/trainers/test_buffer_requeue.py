"""The buffer after a death: the tasks a dead worker (or every worker, for a dead server) held
are admitted again, first; a group from a holder the task no longer has is ignored, so the
run's accounting stays exact (every task trained once, none lost)."""

from __future__ import annotations

import pytest

from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.types import Trajectory, TrajectoryMetadata


def traj(index: int, sample: int = 0, reward: float = 1.0) -> Trajectory:
    return Trajectory(
        sequence_ids=(1, 2, 3),
        loss_mask=(0, 1, 1),
        behavior_logprobs=(0.0, -0.5, -0.5),
        versions=(0, 0, 0),
        reward=reward,
        group_id=f"task{index}",
        metadata=TrajectoryMetadata(traj_id=f"{index}-{sample}", task_index=index),
    )


def test_a_dead_workers_tasks_are_admitted_again_before_new_ones() -> None:
    buf = TrajectoryBuffer(groups_per_step=2, max_staleness=1, total_groups=8)
    a = [ref.index for ref, _ in buf.admit(2, holder="0:0.0/")]
    b = [ref.index for ref, _ in buf.admit(2, holder="1:0.0/")]
    assert (a, b) == ([0, 1], [2, 3])
    assert buf.capacity() == 0  # (version 0 + staleness 1 + 1) * 2 groups in flight
    assert buf.requeue("1:") == [2, 3]  # worker 1 died: its tasks come back
    assert buf.capacity() == 2 and buf.counters["requeued_groups"] == 2
    assert buf.pending() == [0, 1, 2, 3]  # still owed to the run
    again = [ref.index for ref, _ in buf.admit(4, holder="1:1.0/")]  # its successor
    assert again == [2, 3]  # the same tasks, not new ones
    assert buf.stream.cursor == 4  # nothing was drawn twice from the task stream


def test_a_late_group_from_a_superseded_holder_is_ignored() -> None:
    buf = TrajectoryBuffer(groups_per_step=1, max_staleness=0)
    [(ref, _)] = buf.admit(1, holder="0:0.0/")
    buf.requeue("0:")
    # handed back after the requeue: the task is no longer in flight for anyone
    assert buf.complete(ref.index, [traj(ref.index)], holder="0:0.0/") == "ignored"
    buf.admit(1, holder="0:0.1/")  # admitted again, under the worker's new name
    # the old name's group arrives late: ignored; the new name's is taken, once
    assert buf.complete(ref.index, [traj(ref.index)], holder="0:0.0/") == "ignored"
    assert buf.complete(ref.index, [traj(ref.index, 1)], holder="0:0.1/") == "ready"
    batch = buf.pop_batch()
    assert batch is not None
    assert [t.metadata.traj_id for t in batch[0].trajectories] == ["0-1"]


def test_requeue_of_every_holder_and_the_accounting_of_a_whole_run() -> None:
    """A server died under every worker's episodes: everything in flight comes back; the run
    still trains tasks 0..7 once each."""
    g, total = 2, 8
    buf = TrajectoryBuffer(groups_per_step=g, max_staleness=1, total_groups=total)
    trained: list[int] = []
    generation = 0
    for step in range(total // g):
        while (batch := buf.pop_batch()) is None:
            admitted = buf.admit(8, holder=f"0:0.{generation}/")
            if step >= 1 and admitted and generation == 0:  # the server dies once, mid-run
                assert sorted(buf.requeue()) == sorted(r.index for r, _ in admitted)
                generation += 1
                continue
            for ref, _ in admitted:
                assert buf.complete(ref.index, [traj(ref.index)], holder=f"0:0.{generation}/")
        trained += [group.task.index for group in batch]
        buf.set_version(step + 1)
    assert sorted(trained) == list(range(total))  # every task once, none lost
    assert buf.counters["requeued_groups"] > 0


def test_requeued_tasks_are_saved_as_tasks_to_redo() -> None:
    buf = TrajectoryBuffer(groups_per_step=1, max_staleness=1)
    buf.admit(2, holder="3:0.0/")
    buf.requeue("3:")
    state = buf.state_dict()
    assert [r["index"] for r in state["redo"]] == [0, 1]
    fresh = TrajectoryBuffer(groups_per_step=1, max_staleness=1)
    fresh.load_state_dict(state)
    assert [ref.index for ref, _ in fresh.admit(2)] == [0, 1]


@pytest.mark.parametrize("holder", [None, "0:0.0/"])
def test_without_holders_nothing_changes(holder: str | None) -> None:
    buf = TrajectoryBuffer(groups_per_step=1, max_staleness=0)
    [(ref, _)] = buf.admit(1)
    assert buf.complete(ref.index, [traj(ref.index)], holder=holder) == "ready"
