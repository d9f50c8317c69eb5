"""Overlong penalty and overlong filtering on tensors, and on a collated batch of trajectories."""

from __future__ import annotations

import pytest
import torch

from areal_agents.trainers.algorithms import AlgoConfig
from areal_agents.trainers.batching import collate
from areal_agents.trainers.filters import (
    longest_turn,
    overlong_penalty,
    shape_batch,
    truncation_mask,
)
from areal_agents.types import Trajectory


def traj(reward: float, group: str, turns: tuple[int, ...], truncated: bool = False) -> Trajectory:
    """Two prompt tokens, then one run of policy tokens per turn, two tool tokens between."""
    mask = [0, 0]
    for i, n in enumerate(turns):
        mask += ([0, 0] if i else []) + [1] * n
    return Trajectory(
        sequence_ids=tuple(range(len(mask))),
        loss_mask=tuple(mask),
        behavior_logprobs=tuple(-0.5 if m else 0.0 for m in mask),
        versions=tuple(3 if m else -1 for m in mask),
        reward=reward,
        group_id=group,
        truncated=truncated,
    )


def test_overlong_penalty_hand_numbers() -> None:
    lengths = torch.tensor([0, 12, 13, 14, 15, 16, 17, 100])
    pen = overlong_penalty(lengths, max_len=16, buffer=4, penalty=0.5)
    expected = [0.0, 0.0, -0.125, -0.25, -0.375, -0.5, -0.5, -0.5]
    assert pen.tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(lengths, max_len=16, buffer=0)


def test_longest_turn_counts_runs_of_policy_tokens() -> None:
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0, 1]])
    assert longest_turn(mask).tolist() == [3, 0, 1]


def test_truncation_mask_zeroes_rows() -> None:
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    out = truncation_mask(mask, torch.tensor([True, False]))
    assert out.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert mask.tolist() == [[1, 0, 1], [1, 1, 1]]  # input untouched


def test_shape_batch_penalises_the_longest_turn_and_masks_truncated_rows() -> None:
    cfg = AlgoConfig.from_name("dapo").replace(overlong_buffer=4, mask_truncated=True)
    batch = collate(
        [
            traj(1.0, "a", (10, 10)),  # two turns of 10: no turn near the limit of 16
            traj(1.0, "a", (3, 14)),  # a turn 2 tokens into the buffer: -0.5
            traj(0.0, "b", (20,), truncated=True),  # past the limit: -1, and no loss
        ],
        pad_id=0,
    )
    rewards, mask, metrics = shape_batch(
        cfg, batch.rewards, batch.loss_mask, batch.truncated, max_response_tokens=16
    )
    assert rewards.tolist() == [1.0, 0.5, -1.0]
    assert mask[2].sum() == 0 and torch.equal(mask[:2], batch.loss_mask[:2])
    assert metrics == {
        "filter/overlong_penalty": pytest.approx(-0.5),
        "filter/overlong_rows": 2.0,
        "filter/truncated_masked_rows": 1.0,
    }
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0]  # pure: the inputs are unchanged
    with pytest.raises(ValueError, match="per-turn token limit"):
        shape_batch(cfg, batch.rewards, batch.loss_mask, batch.truncated, None)
    # with everything off, rewards and mask pass through untouched
    same_r, same_m, none = shape_batch(
        AlgoConfig(), batch.rewards, batch.loss_mask, batch.truncated, None
    )
    assert same_r is batch.rewards and same_m is batch.loss_mask and none == {}
