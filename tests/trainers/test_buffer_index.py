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
        if len(head) < g or not buf._feasible(deadlines, set(head)):
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
    pops = 0
    for step in range(2000):
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
        if step % 500 == 499:  # a resume: in-flight tasks become tasks to redo
            state = buf.state_dict()
            buf = TrajectoryBuffer(3, eta, batch_order=order, dynamic_sampling=True)
            buf.load_state_dict(state)
            inflight = []
    assert pops > 50  # the history did exercise the pops
