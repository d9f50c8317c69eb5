"""The critic's loss (PPO with GAE): clipped value regression on the policy tokens.

>>> v = torch.tensor([[0.5, 2.0]])
>>> loss, _ = value_loss(v, torch.zeros_like(v), torch.ones_like(v), torch.ones_like(v), None)
>>> loss.tolist()
[[0.125, 0.5]]
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from areal_agents.trainers.losses import aggregate
from areal_agents.trainers.masked import masked_mean

__all__ = ["ValueKnobs", "compute_value_loss", "value_loss"]


class ValueKnobs(Protocol):
    """The algorithm settings the value loss reads (``AlgoConfig`` provides them)."""

    @property
    def vf_coef(self) -> float: ...
    @property
    def vf_clip(self) -> float | None: ...
    @property
    def aggregation(self) -> str: ...
    @property
    def norm_tokens(self) -> int | None: ...


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token ``0.5 * max((V - R)^2, (V_clip - R)^2)``, ``V_clip = V_old + clip(V - V_old)``.

    Without ``clip`` it is ``0.5 * (V - R)^2``. Metrics: how often the clipped branch won,
    the value mean, and the explained variance of the returns.
    """
    returns = returns.detach()
    err = (values - returns) ** 2  # [B, T]
    if clip is None:
        per_token = 0.5 * err
        clipped_frac = torch.zeros((), dtype=values.dtype, device=values.device)
    else:
        v_clip = old_values.detach() + (values - old_values.detach()).clamp(-clip, clip)
        err_clip = (v_clip - returns) ** 2  # [B, T]
        per_token = 0.5 * torch.maximum(err, err_clip)
        clipped_frac = masked_mean((err_clip > err).to(values.dtype), mask)
    resid = (returns - values.detach()) * mask
    var_r = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    var_e = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    metrics = {
        "value/clip_frac": clipped_frac,
        "value/mean": masked_mean(values.detach(), mask),
        "value/explained_var": 1.0 - var_e / var_r.clamp(min=1e-8),
    }
    return per_token, metrics


def compute_value_loss(
    cfg: ValueKnobs,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``vf_coef * agg(0.5 * max((V - R)^2, (V_clip - R)^2))`` and detached metrics.

    The returned loss already carries ``vf_coef``: the learner adds it to the policy loss.
    ``loss/value`` (unweighted) adds up over micro-batches like the policy's ``loss/*``; the
    ``value/*`` metrics are token means over this call's mask.
    """
    maskf = mask.to(values.dtype)
    m = mask.bool()
    zero = torch.zeros_like(values)
    v = torch.where(m, values, zero)
    per_token, metrics = value_loss(
        v, torch.where(m, old_values.to(v.dtype), zero), torch.where(m, returns.to(v.dtype), zero),
        maskf, cfg.vf_clip,
    )  # fmt: skip
    raw = aggregate(
        torch.where(m, per_token, zero), maskf, cfg.aggregation,
        norm_tokens=cfg.norm_tokens, normalizer=normalizer,
    )  # fmt: skip
    metrics["loss/value"] = raw.detach()
    return cfg.vf_coef * raw, metrics
