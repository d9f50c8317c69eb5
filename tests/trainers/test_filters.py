"""Dynamic sampling and overlong handling, on tensors and on real Trajectory objects."""

from __future__ import annotations

import pytest
import torch

from areal_agents.trainers.algorithms import AlgoConfig
from areal_agents.trainers.filters import (
    apply_filters,
    drop_uniform_groups,
    overlong_penalty,
    truncation_mask,
    uniform_group_mask,
)
from areal_agents.types import Trajectory


def traj(reward: float, group: str, n_policy: int, truncated: bool = False) -> Trajectory:
    n = 2 + n_policy  # two prompt tokens, then the response
    return Trajectory(
        sequence_ids=tuple(range(n)),
        loss_mask=(0, 0) + (1,) * n_policy,
        behavior_logprobs=(0.0, 0.0) + (-0.5,) * n_policy,
        versions=(-1, -1) + (3,) * n_policy,
        reward=reward,
        group_id=group,
        truncated=truncated,
    )


def test_uniform_groups_are_flagged() -> None:
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    ids = ["a", "a", "a", "b", "b", "c", "c", "solo"]
    assert uniform_group_mask(r, ids).tolist() == [False] * 3 + [True] * 2 + [False] * 3
    # with a tolerance, a spread of 0.5 or less counts as uniform
    r2 = torch.tensor([1.0, 1.4, 0.0, 1.0])
    assert uniform_group_mask(r2, ["a", "a", "b", "b"], tol=0.5).tolist() == [
        False,
        False,
        True,
        True,
    ]


def test_overlong_penalty_hand_numbers() -> None:
    lengths = torch.tensor([0, 12, 13, 14, 15, 16, 17, 100])
    pen = overlong_penalty(lengths, max_len=16, buffer=4, penalty=0.5)
    expected = [0.0, 0.0, -0.125, -0.25, -0.375, -0.5, -0.5, -0.5]
    assert pen.tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(lengths, max_len=16, buffer=0)


def test_truncation_mask_zeroes_rows() -> None:
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    out = truncation_mask(mask, torch.tensor([True, False]))
    assert out.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert mask.tolist() == [[1, 0, 1], [1, 1, 1]]  # input untouched


def test_drop_uniform_groups_on_trajectories() -> None:
    batch = [traj(1.0, "a", 3), traj(1.0, "a", 4), traj(0.0, "b", 3), traj(1.0, "b", 3)]
    kept, dropped = drop_uniform_groups(batch)
    assert [t.group_id for t in kept] == ["b", "b"] and dropped == 1
    assert drop_uniform_groups([]) == ([], 0)


def test_apply_filters_in_dapo_order() -> None:
    cfg = AlgoConfig.from_name("dapo").replace(overlong_buffer=4, mask_truncated=True)
    batch = [
        traj(1.0, "a", 10),  # short: no penalty
        traj(1.0, "a", 14),  # 2 tokens into the buffer: -0.5 -> the group now has spread
        traj(0.0, "b", 3),
        traj(0.0, "b", 20, truncated=True),  # past the limit: -1, and no loss
        traj(1.0, "c", 3),
        traj(1.0, "c", 5),  # uniform: dropped
    ]
    kept, stats = apply_filters(cfg, batch, max_response_tokens=16)
    assert [(t.group_id, t.reward) for t in kept] == [
        ("a", 1.0), ("a", 0.5), ("b", 0.0), ("b", -1.0)
    ]  # fmt: skip
    assert kept[3].num_policy_tokens == 0 and kept[2].num_policy_tokens == 3
    assert stats.groups_in == 3 and stats.groups_dropped == 1 and stats.samples_dropped == 2
    assert stats.samples_penalised == 2 and stats.samples_masked == 1
    assert batch[1].reward == 1.0  # pure: the inputs are unchanged
    with pytest.raises(ValueError, match="max_response_tokens"):
        apply_filters(cfg, batch)
    # with everything off, the batch passes through untouched
    same, stats = apply_filters(AlgoConfig(), batch)
    assert same == batch and stats.samples_dropped == 0
