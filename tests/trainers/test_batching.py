"""Padding, the shift to predicted-token positions, rank split and micro-batches."""

from __future__ import annotations

import torch

from areal_agents.trainers.batching import collate, micro_batches, plan, split_minibatches
from areal_agents.types import Trajectory


def make(n: int, reward: float = 0.0, group: str = "g") -> Trajectory:
    mask = tuple([0] * (n // 2) + [1] * (n - n // 2))
    return Trajectory(
        tuple(range(1, n + 1)), mask, tuple(-0.1 * m for m in mask),
        tuple(0 if m else -1 for m in mask), reward, group,
    )  # fmt: skip


def test_collate_shifts_to_predicted_positions() -> None:
    b = collate([make(4), make(6)], pad_id=0)
    assert b.sequence_ids.shape == (2, 6) and b.loss_mask.shape == (2, 5)
    assert b.loss_mask[0].tolist() == [0.0, 1.0, 1.0, 0.0, 0.0]  # ids[2:4] are predicted at 1..2
    assert b.attention_mask[0].tolist() == [1, 1, 1, 1, 0, 0]
    sub = b.rows([0])
    assert sub.sequence_ids.shape == (1, 4) and torch.equal(sub.loss_mask, b.loss_mask[:1, :3])


def test_every_rank_runs_the_same_number_of_micro_batches() -> None:
    lengths = [30, 5, 5, 5, 5, 5]
    rows = list(range(6))
    plans = [plan(rows, lengths, 2, r, budget=10) for r in range(2)]
    assert len(plans[0]) == len(plans[1])
    covered = sorted(i for p in plans for mb in p for i in mb)
    assert covered == rows
    assert [] in plans[0] or [] in plans[1]  # the lighter rank is padded with empty ones


def test_micro_batches_respect_the_budget() -> None:
    lengths = [7, 7, 7, 20, 3]
    for mb in micro_batches(range(5), lengths, budget=16):
        assert len(mb) == 1 or max(lengths[i] for i in mb) * len(mb) <= 16


def test_minibatches_keep_groups_whole() -> None:
    ids = ["a", "a", "b", "b", "c", "c"]
    parts = split_minibatches(ids, 2)
    assert len(parts) == 2
    for part in parts:
        assert all(ids.count(ids[i]) == sum(1 for j in part if ids[j] == ids[i]) for i in part)
