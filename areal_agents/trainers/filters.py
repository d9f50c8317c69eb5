"""Batch filters a trainer applies before computing advantages (DAPO's tricks and friends).

* Dynamic sampling: a group whose rewards are all equal has zero group-relative advantage and
  only dilutes the batch; :func:`uniform_group_mask` / :func:`drop_uniform_groups` drop it.
* Soft overlong punishment: :func:`overlong_penalty` lowers the reward linearly over the last
  ``buffer`` tokens before the length limit, down to ``-penalty`` past it.
* Overlong filtering: :func:`truncation_mask` removes truncated episodes from the loss (their
  reward still counts in their group's baseline).

:func:`apply_filters` runs the three on a list of trajectories as an ``AlgoConfig`` asks.
Each function is pure: it returns new objects and never changes its inputs.

>>> uniform_group_mask(torch.tensor([1.0, 1.0, 0.0, 1.0]), ["a", "a", "b", "b"]).tolist()
[False, False, True, True]
>>> overlong_penalty(torch.tensor([10, 14, 16, 20]), max_len=16, buffer=4).tolist()
[0.0, -0.5, -1.0, -1.0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from areal_agents.trainers.advantages import group_index, group_stats
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from areal_agents.trainers.algorithms import AlgoConfig

__all__ = [
    "FilterStats",
    "apply_filters",
    "drop_uniform_groups",
    "overlong_penalty",
    "truncation_mask",
    "uniform_group_mask",
]


def uniform_group_mask(rewards: Tensor, group_ids: Sequence[str], tol: float = 0.0) -> Tensor:
    """``[B]`` bool: True for samples whose group's rewards differ by more than ``tol``.

    A group of one sample counts as uniform (it has nothing to compare against).
    """
    idx = group_index(list(group_ids), device=rewards.device)
    r = rewards.to(torch.float64)
    num = int(idx.max().item()) + 1 if idx.numel() else 0
    hi = torch.full((num,), -torch.inf, dtype=r.dtype, device=r.device)
    lo = torch.full((num,), torch.inf, dtype=r.dtype, device=r.device)
    hi = hi.scatter_reduce(0, idx, r, "amax")  # [G]
    lo = lo.scatter_reduce(0, idx, r, "amin")  # [G]
    _, _, size = group_stats(r, idx)
    return ((hi - lo)[idx] > tol) & (size > 1)


def drop_uniform_groups(
    trajectories: Sequence[Trajectory], tol: float = 0.0
) -> tuple[list[Trajectory], int]:
    """The trajectories of groups with reward spread, and how many groups were dropped."""
    if not trajectories:
        return [], 0
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float64)
    ids = [t.group_id for t in trajectories]
    keep = uniform_group_mask(rewards, ids, tol).tolist()
    dropped = len({g for g, k in zip(ids, keep, strict=True) if not k})
    return [t for t, k in zip(trajectories, keep, strict=True) if k], dropped


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment per sample, ``[B]`` floats in ``[-penalty, 0]``.

    ``0`` up to ``max_len - buffer`` tokens, then falling linearly to ``-penalty`` at
    ``max_len``, and ``-penalty`` beyond.
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"overlong buffer={buffer} must be in [1, max_len={max_len}]")
    start = max_len - buffer
    over = (lengths.to(torch.float64) - start).clamp(min=0.0, max=float(buffer))
    return (0.0 - penalty * over / buffer).to(torch.float32)  # 0.0 - x: no -0.0


def truncation_mask(mask: Tensor, truncated: Tensor) -> Tensor:
    """``mask`` with the rows of truncated episodes zeroed: no loss from them (overlong filter)."""
    return mask * (~truncated.bool())[:, None].to(mask.dtype)


@dataclass(frozen=True)
class FilterStats:
    """What :func:`apply_filters` did to one batch (for logging)."""

    groups_in: int
    groups_dropped: int
    samples_dropped: int
    samples_penalised: int
    samples_masked: int


def apply_filters(
    cfg: AlgoConfig,
    trajectories: Sequence[Trajectory],
    max_response_tokens: int | None = None,
) -> tuple[list[Trajectory], FilterStats]:
    """Overlong penalty, then overlong filtering, then dynamic sampling, as ``cfg`` says.

    The response length is a trajectory's number of policy tokens (all turns together);
    ``max_response_tokens`` is needed only when ``cfg.overlong_buffer > 0``. Dynamic sampling
    looks at the rewards *after* the penalty, i.e. the ones the advantages will see. Overlong
    filtering zeroes a truncated trajectory's loss mask instead of dropping it, so its reward
    still counts in its group's baseline.
    """
    out = list(trajectories)
    penalised = masked = 0
    if cfg.overlong_buffer > 0:
        if max_response_tokens is None:
            raise ValueError("algo.overlong_buffer > 0 needs max_response_tokens (the length cap)")
        lengths = torch.tensor([t.num_policy_tokens for t in out], dtype=torch.long)
        pen = overlong_penalty(
            lengths, max_response_tokens, cfg.overlong_buffer, cfg.overlong_penalty
        ).tolist()
        penalised = sum(p < 0 for p in pen)
        out = [
            dataclasses.replace(t, reward=t.reward + p) if p < 0 else t
            for t, p in zip(out, pen, strict=True)
        ]
    if cfg.mask_truncated:
        masked = sum(t.truncated for t in out)
        out = [
            dataclasses.replace(t, loss_mask=(0,) * len(t.loss_mask)) if t.truncated else t
            for t in out
        ]
    groups_in = len({t.group_id for t in out})
    dropped_groups = 0
    n_before = len(out)
    if cfg.dynamic_sampling:
        out, dropped_groups = drop_uniform_groups(out)
    stats = FilterStats(groups_in, dropped_groups, n_before - len(out), penalised, masked)
    return out, stats
