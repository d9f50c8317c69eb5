"""Reward shaping and loss masking a learner applies to a batch before its advantages (DAPO).

* Soft overlong punishment (``algo.overlong_buffer``, ``algo.overlong_penalty``): a trajectory
  whose longest assistant turn comes within ``buffer`` tokens of the per-turn limit loses
  reward linearly, down to ``-penalty`` at the limit (:func:`overlong_penalty`). A turn is a run
  of policy tokens (the environment's tokens separate turns): :func:`longest_turn`.
* Overlong filtering (``algo.mask_truncated``): a truncated episode gets no loss
  (:func:`truncation_mask`); its reward still counts in its group's baseline.
* Down-sampling (``algo.keep_per_group``, PODS): of each group, the rows whose rewards vary the
  most (:func:`max_variance_rows`); the learner trains those and computes the advantages among
  them.
* The placebo (``algo.shuffle_rewards``): the rewards in a seeded random order
  (:func:`shuffled_rewards`), among the whole batch or within each group
  (``algo.shuffle_scope``), so that an update of the real one's size carries no signal.

:func:`shape_batch` applies both as the config asks; every rank of the learner applies it to
the whole batch, identically. Dynamic sampling (``algo.dynamic_sampling``) is not here: it
decides which groups are trained at all, so the trajectory buffer drops uniform groups and
admits other tasks in their place. Each function is pure.

>>> overlong_penalty(torch.tensor([10, 14, 16, 20]), max_len=16, buffer=4).tolist()
[0.0, -0.5, -1.0, -1.0]
>>> longest_turn(torch.tensor([[0, 1, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])).tolist()
[3, 0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

__all__ = [
    "FilterKnobs",
    "longest_turn",
    "max_variance_rows",
    "overlong_penalty",
    "shape_batch",
    "shuffled_rewards",
    "truncation_mask",
]


class FilterKnobs(Protocol):
    """The algorithm settings the batch filters read (``AlgoConfig`` provides them)."""

    @property
    def overlong_buffer(self) -> int: ...
    @property
    def overlong_penalty(self) -> float: ...
    @property
    def mask_truncated(self) -> bool: ...
    @property
    def shuffle_rewards(self) -> bool: ...
    @property
    def shuffle_scope(self) -> str: ...


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


def longest_turn(loss_mask: Tensor) -> Tensor:
    """``[B]``: the longest run of consecutive policy tokens in each row of ``[B, T]``."""
    on = loss_mask.bool()
    pos = torch.arange(on.shape[1], device=on.device).expand_as(on)
    last_off = torch.where(on, torch.full_like(pos, -1), pos).cummax(dim=1).values  # [B, T]
    run = torch.where(on, pos - last_off, torch.zeros_like(pos))  # [B, T]
    return run.max(dim=1).values if on.shape[1] else torch.zeros(on.shape[0], dtype=torch.long)


def truncation_mask(mask: Tensor, truncated: Tensor) -> Tensor:
    """``mask`` with the rows of truncated episodes zeroed: no loss from them (overlong filter)."""
    return mask * (~truncated.bool())[:, None].to(mask.dtype)


def shuffled_rewards(rewards: Tensor, seed: int, groups: Sequence[str] | None = None) -> Tensor:
    """``rewards`` ``[B]`` in a random order drawn from ``seed``: the same rewards, none of them
    (except by chance) on the episode that earned it; with ``groups`` (each row's group id),
    each group's rewards are shuffled among its own rows only.

    >>> r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5])
    >>> s = shuffled_rewards(r, seed=3)
    >>> sorted(s.tolist()) == sorted(r.tolist()), torch.equal(s, shuffled_rewards(r, seed=3))
    (True, True)
    >>> g = shuffled_rewards(r, seed=3, groups=["a", "a", "b", "b", "c"])
    >>> sorted(g[:2].tolist()), sorted(g[2:4].tolist()), g[4].item()
    ([0.0, 1.0], [0.0, 1.0], 0.5)
    """
    generator = torch.Generator().manual_seed(seed)
    if groups is None:
        return rewards[torch.randperm(rewards.shape[0], generator=generator)]
    out = rewards.clone()
    for gid in dict.fromkeys(groups):  # each group once, in order of appearance
        rows = torch.tensor([i for i, g in enumerate(groups) if g == gid], dtype=torch.long)
        out[rows] = rewards[rows[torch.randperm(rows.shape[0], generator=generator)]]
    return out


def max_variance_rows(
    rewards: Tensor, group_ids: Sequence[str], keep: int, seed: int = 0
) -> list[int]:
    """PODS's max-variance down-sampling: per group, the ``keep`` rows whose rewards have the
    largest variance, in row order. That set is always the ``k`` lowest and ``keep - k``
    highest rewards for some ``k`` (Xu et al., 2025), so each ``k`` is tried; among equal
    rewards the rows are drawn at random from ``seed``. A group of ``keep`` rows or fewer is
    kept whole.

    >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    >>> rows = max_variance_rows(r, ["a"] * 8, keep=4)
    >>> len(rows), sorted(r[rows].tolist())   # both successes, two of the six failures
    (4, [0.0, 0.0, 1.0, 1.0])
    >>> max_variance_rows(torch.tensor([0.1, 0.5, 0.9, 0.2]), ["a", "a", "a", "a"], keep=2)
    [0, 2]
    """
    gen = torch.Generator().manual_seed(seed)
    members: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    out: list[int] = []
    for rows in members.values():
        if len(rows) <= keep:
            out += rows
            continue
        drawn = [rows[j] for j in torch.randperm(len(rows), generator=gen).tolist()]
        order = sorted(drawn, key=lambda i: float(rewards[i]))  # stable: ties stay drawn
        best: list[int] = []
        best_var = -1.0
        for k in range(keep + 1):
            chosen = order[:k] + order[len(order) - (keep - k) :]
            var = float(rewards[chosen].double().var(unbiased=False))
            if var > best_var + 1e-12:
                best, best_var = chosen, var
        out += best
    return sorted(out)


def shape_batch(
    cfg: FilterKnobs,
    rewards: Tensor,
    loss_mask: Tensor,
    truncated: Tensor,
    max_response_tokens: int | None,
    *,
    shuffle_seed: int = 0,
    group_ids: Sequence[str] | None = None,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """``(rewards [B], loss_mask [B, T], metrics)`` after the placebo shuffle (when
    ``cfg.shuffle_rewards``, drawn from ``shuffle_seed``: pass one per step), the overlong
    penalty and filtering.

    ``max_response_tokens`` is the per-turn limit (needed when ``cfg.overlong_buffer > 0``);
    ``group_ids`` the rows' groups (needed when ``cfg.shuffle_scope`` is ``group``).
    Metrics: ``filter/overlong_penalty`` (the mean penalty added to the rewards),
    ``filter/overlong_rows`` and ``filter/truncated_masked_rows`` (rows affected),
    ``filter/shuffled_rewards`` (1 when the placebo shuffled them).
    """
    metrics: dict[str, float] = {}
    if cfg.shuffle_rewards:
        if cfg.shuffle_scope == "group" and group_ids is None:
            raise ValueError("algo.shuffle_scope=group needs the rows' group ids")
        within = group_ids if cfg.shuffle_scope == "group" else None
        rewards = shuffled_rewards(rewards, shuffle_seed, within)
        metrics["filter/shuffled_rewards"] = 1.0
    if cfg.overlong_buffer > 0:
        if max_response_tokens is None:
            raise ValueError("algo.overlong_buffer > 0 needs the per-turn token limit")
        pen = overlong_penalty(
            longest_turn(loss_mask), max_response_tokens, cfg.overlong_buffer, cfg.overlong_penalty
        ).to(rewards.dtype)  # [B]
        rewards = rewards + pen
        metrics["filter/overlong_penalty"] = float(pen.mean())
        metrics["filter/overlong_rows"] = float((pen < 0).sum())
    if cfg.mask_truncated:
        loss_mask = truncation_mask(loss_mask, truncated)
        metrics["filter/truncated_masked_rows"] = float(truncated.bool().sum())
    return rewards, loss_mask, metrics
