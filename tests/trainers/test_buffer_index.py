"""The buffer's indexes (O(G) pops) choose exactly the batches of the plain O(n) rule."""

from __future__ import annotations

import random

import pytest

from areal_agents.trainers.buffer import BatchOrder, TrajectoryBuffer
from areal_agents.types import Trajectory


def reference_head(buf: TrajectoryBuffer) -> list[int] | None:
    """The rule of the module docstring, computed from scratch on the whole pending set."""
    g = buf.groups_per_step
    ready = set(buf._ready)
    if buf.batch_order == "admission":
        head = buf.pending()[:g]
    else:
        deadlines = buf.deadlines()
        urgent = sorted(deadlines, key=lambda i: (deadlines[i], i))
        head = [i for i in urgent if i in ready][:g]
        first = buf.trained_groups // g + 1  # the step after the one being filled
        rest = sorted(d for i, d in deadlines.items() if i not in set(head))
        if len(head) < g or not all(first + k // g <= d for k, d in enumerate(rest)):
            head = urgent[:g]
    if len(head) < g or any(i not in ready for i in head):
        return None
    return head


def traj(reward: float) -> list[Trajectory]:
    return [Trajectory((), (), (), (), reward=reward, group_id="g")]


@pytest.mark.parametrize("order", ["ready", "admission"])
@pytest.mark.parametrize("eta", [0, 1, 3])
def test_pops_match_the_reference_rule_over_random_histories(order: BatchOrder, eta: int) -> None:
    rng = random.Random(eta * 10 + len(order))
    buf = TrajectoryBuffer(3, eta, batch_order=order, dynamic_sampling=True)
    inflight: list[int] = []
    version = 0
    pops = hold = 0
    for step in range(2000):
        hold -= 1
        if hold <= 0:  # after a resume, the tasks to redo wait a while: pops must pass them
            inflight += [ref.index for ref, _ in buf.admit(rng.randint(0, 4))]
        if inflight and rng.random() < 0.7:
            i = inflight.pop(rng.randrange(len(inflight)))
            kind = rng.random()
            # ready, dropped (no trajectory) or filtered (all rewards equal)
            trajs = traj(0.0) + traj(1.0) if kind < 0.8 else ([] if kind < 0.9 else traj(1.0))
            buf.complete(i, trajs)
        expected = reference_head(buf)
        batch = buf.pop_batch()
        assert (None if batch is None else [g.task.index for g in batch]) == expected
        if batch is not None:
            pops += 1
            version += 1
            buf.set_version(version)
        if step % 250 == 249:  # a resume: in-flight tasks become tasks to redo
            state = buf.state_dict()
            buf = TrajectoryBuffer(3, eta, batch_order=order, dynamic_sampling=True)
            buf.load_state_dict(state)
            inflight, hold = [], 40
    assert pops > 50  # the history did exercise the pops


def test_a_task_to_redo_among_the_most_urgent_holds_the_batch() -> None:
    # Step 5 (10 groups trained), staleness 1: ready groups 20 (deadline 5), 21-23 (deadline
    # 6); task 19 is to redo (deadline 5 + 1 = 6). Taking the oldest complete [20, 21] would
    # leave 19, 22, 23 for steps 6, 6, 7: 23 would miss deadline 6, so the batch must be the
    # most urgent [20, 19] — and 19 has not run yet: no batch.
    donor = TrajectoryBuffer(2, 1)
    for i in range(19, 24):
        donor.stream.cursor = i
        (ref, _), *_ = donor.admit(1)
        donor.set_version(4 if i == 20 else 5)
        donor._inflight[i] = (ref, 4 if i == 20 else 5)
        if i != 19:
            donor.complete(i, traj(0.0) + traj(1.0))
    state = donor.state_dict()
    state.update(version=5, trained_groups=10)
    buf = TrajectoryBuffer(2, 1)
    buf.load_state_dict(state)
    assert [r.index for r in buf._redo] == [19]
    assert reference_head(buf) is None
    assert buf.pop_batch() is None
