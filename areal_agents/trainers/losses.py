"""Policy and value losses: pure tensor functions chosen by name from a registry.

A policy loss maps the three log-probabilities of off-policy training, kept apart and named,

* ``logprobs`` — the current policy (requires grad),
* ``proximal_logprobs`` — the policy at the start of this training step (no grad),
* ``behavior_logprobs`` — the policy that sampled the tokens, from the rollout (no grad),

plus ``advantages`` and ``mask`` (all ``[B, T]``) to a *per-token* loss ``[B, T]`` and a dict of
detached metric tensors. Averaging is a separate, explicit step (:func:`aggregate`), so that every
loss can be combined with every aggregation. Like the estimators, losses are position-agnostic:
any alignment of ``T`` works as long as all inputs share it. Nothing here calls ``.item()``.

Adding a loss is one function and one line::

    @register_loss("my_pg")
    def my_pg(cfg, logprobs, proximal_logprobs, behavior_logprobs, advantages, mask):
        return -advantages * logprobs, {}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.trainers.advantages import masked_mean, masked_sum

if TYPE_CHECKING:
    from areal_agents.trainers.algorithms import AlgoConfig

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "PolicyLoss",
    "aggregate",
    "behavior_weights",
    "clipped_surrogate",
    "decoupled_ppo_loss",
    "get_loss",
    "kl_estimate",
    "masked_max",
    "masked_min",
    "ppo_clip_loss",
    "register_loss",
    "reinforce_loss",
    "value_loss",
]

#: The explicit ways of turning a per-token loss ``[B, T]`` into a scalar.
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_sum_norm")
#: Schulman's estimators of KL(pi || pi_ref) from samples of pi.
KL_ESTIMATORS = ("k1", "k2", "k3")


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Largest ``x`` on the mask (0 for an empty mask)."""
    m = mask.bool()
    out = torch.where(m, x, torch.full_like(x, -torch.inf)).max()
    return torch.where(m.any(), out, torch.zeros_like(out))


def masked_min(x: Tensor, mask: Tensor) -> Tensor:
    """Smallest ``x`` on the mask (0 for an empty mask)."""
    m = mask.bool()
    out = torch.where(m, x, torch.full_like(x, torch.inf)).min()
    return torch.where(m.any(), out, torch.zeros_like(out))


def aggregate(
    x: Tensor,
    mask: Tensor,
    mode: str,
    *,
    norm_tokens: int | None = None,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Reduce a per-token ``[B, T]`` tensor to a scalar over the policy tokens.

    * ``token_mean`` — sum over all policy tokens / their number (DAPO, TRL ``bnpo``).
    * ``seq_mean_token_mean`` — mean over rows with policy tokens of each row's token mean
      (GRPO as published, TRL ``grpo``).
    * ``seq_sum_norm`` — sum over all policy tokens / (B * L) with ``L = norm_tokens`` or, when
      None, the ``T`` of the batch (Dr. GRPO, TRL ``dr_grpo`` with ``L = max_completion_length``).

    ``normalizer`` replaces the denominator (tokens, rows, or B * L) with a number the caller
    computed over a larger batch, so that micro-batch losses *sum* to the full-batch mean under
    gradient accumulation (rows use the per-row token means in the numerator as before).

    >>> x = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0]])
    >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    >>> aggregate(x, m, "token_mean"), aggregate(x, m, "seq_mean_token_mean")
    (tensor(3.), tensor(3.5000))
    >>> aggregate(x, m, "seq_sum_norm", norm_tokens=4)
    tensor(1.1250)
    """
    maskf = mask.to(x.dtype)
    if mode == "token_mean":
        denom = maskf.sum().clamp(min=1.0) if normalizer is None else normalizer
        return masked_sum(x, mask) / denom
    if mode == "seq_mean_token_mean":
        per_row = masked_sum(x, mask, dim=1) / maskf.sum(1).clamp(min=1.0)  # [B]
        rows = (maskf.sum(1) > 0).to(x.dtype)  # [B]
        denom = rows.sum().clamp(min=1.0) if normalizer is None else normalizer
        return (per_row * rows).sum() / denom
    if mode == "seq_sum_norm":
        length = x.shape[1] if norm_tokens is None else norm_tokens
        denom = float(x.shape[0] * length) if normalizer is None else normalizer
        return masked_sum(x, mask) / denom
    raise ConfigError(
        f"algo.aggregation={mode!r} is unknown"
        + did_you_mean(mode, AGGREGATIONS)
        + f"; choose one of {list(AGGREGATIONS)}"
    )


def _log_ratio(a: Tensor, b: Tensor, limit: float | None) -> Tensor:
    lr = a - b
    return lr if limit is None else lr.clamp(-limit, limit)


def kl_estimate(
    logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3", limit: float | None = 20.0
) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) on tokens sampled from pi, ``[B, T]``.

    With ``d = logprobs - ref_logprobs`` (clamped to ``±limit``): ``k1 = d``,
    ``k2 = d^2 / 2``, ``k3 = exp(-d) - 1 + d`` (unbiased and never negative; TRL's GRPO KL).
    """
    d = _log_ratio(logprobs, ref_logprobs, limit)
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.expm1(-d) + d
    raise ConfigError(
        f"algo.kl_estimator={estimator!r} is unknown"
        + did_you_mean(estimator, KL_ESTIMATORS)
        + f"; choose one of {list(KL_ESTIMATORS)}"
    )


PolicyLoss = Callable[
    ["AlgoConfig", Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, dict[str, Tensor]]
]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make a per-token policy loss selectable as ``algo.loss=NAME``."""

    def deco(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES and POLICY_LOSSES[name] is not fn:
            raise ConfigError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; unknown names fail with a suggestion."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ConfigError(
            f"algo.loss={name!r} is not a known policy loss"
            + did_you_mean(name, POLICY_LOSSES)
            + f"; choose one of {sorted(POLICY_LOSSES)}"
        ) from None


def _ratio_metrics(ratio: Tensor, mask: Tensor, prefix: str) -> dict[str, Tensor]:
    r = ratio.detach()
    return {
        f"{prefix}/mean": masked_mean(r, mask),
        f"{prefix}/min": masked_min(r, mask),
        f"{prefix}/max": masked_max(r, mask),
    }


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, with optional dual clip.

    Dual clip (Ye et al. 2020) bounds the loss of negative-advantage tokens by ``-c A``, so a
    huge ratio on a bad token cannot blow the update up. Where a clip is active the token's
    gradient is exactly 0: ``A > 0, r > 1 + eps_high``; ``A < 0, r < 1 - eps_low``; and with
    dual clip ``A < 0, r > c``.
    """
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # [B, T]
    pg = torch.maximum(-advantages * ratio, -advantages * clipped)  # [B, T]
    high = (advantages > 0) & (ratio > 1.0 + eps_high)
    low = (advantages < 0) & (ratio < 1.0 - eps_low)
    dual = torch.zeros_like(high)
    if dual_clip_c is not None:
        bound = -dual_clip_c * advantages  # [B, T]
        dual = (advantages < 0) & (ratio > dual_clip_c)
        pg = torch.where(advantages < 0, torch.minimum(pg, bound), pg)
    metrics = {
        "clip/high_frac": masked_mean(high.to(ratio.dtype), mask),
        "clip/low_frac": masked_mean(low.to(ratio.dtype), mask),
        "clip/dual_frac": masked_mean(dual.to(ratio.dtype), mask),
        "clip/frac": masked_mean((high | low | dual).to(ratio.dtype), mask),
    }
    return pg, metrics


def behavior_weights(
    proximal_logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, cap: float | None, mode: str
) -> tuple[Tensor, dict[str, Tensor]]:
    """Importance weight ``pi_prox / pi_behav`` per token, truncated or masked above ``cap``.

    ``mode="truncate"`` uses ``min(w, cap)`` (truncated importance sampling); ``mode="mask"``
    drops tokens with ``w > cap`` (weight 0), as AReaL does. No gradient flows through it.
    """
    w = torch.exp(_log_ratio(proximal_logprobs, behavior_logprobs, 20.0)).detach()  # [B, T]
    over = torch.zeros_like(w, dtype=torch.bool) if cap is None else w > cap
    if cap is not None:
        w_used = w.clamp(max=cap) if mode == "truncate" else torch.where(over, 0.0 * w, w)
    else:
        w_used = w
    metrics = _ratio_metrics(w, mask, "behavior/weight")
    metrics["behavior/capped_frac"] = masked_mean(over.to(w.dtype), mask)
    metrics["behavior/kl"] = masked_mean(
        kl_estimate(proximal_logprobs.detach(), behavior_logprobs, "k3"), mask
    )
    return w_used, metrics


def _ppo_terms(
    cfg: AlgoConfig, logprobs: Tensor, proximal_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    ratio = torch.exp(_log_ratio(logprobs, proximal_logprobs.detach(), cfg.max_log_ratio))
    pg, metrics = clipped_surrogate(
        ratio, advantages, mask, cfg.clip_eps_low, cfg.clip_eps_high, cfg.dual_clip_c
    )
    metrics.update(_ratio_metrics(ratio, mask, "ratio"))
    metrics["approx_kl"] = masked_mean(
        kl_estimate(logprobs.detach(), proximal_logprobs.detach(), "k3"), mask
    )
    return pg, metrics


@register_loss("ppo_clip")
def ppo_clip_loss(
    cfg: AlgoConfig,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO surrogate on ``r = pi / pi_prox``, asymmetric (clip-higher) and dual clip.

    The behaviour policy only feeds metrics: with on-policy data pass the rollout log-probs as
    ``proximal_logprobs`` too (then this is textbook PPO/GRPO).
    """
    pg, metrics = _ppo_terms(cfg, logprobs, proximal_logprobs, advantages, mask)
    _, bmetrics = behavior_weights(
        proximal_logprobs, behavior_logprobs, mask, cfg.behavior_imp_cap, cfg.behavior_imp_mode
    )
    metrics.update(bmetrics)
    return pg, metrics


@register_loss("decoupled_ppo")
def decoupled_ppo_loss(
    cfg: AlgoConfig,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Decoupled PPO (AReaL): ``w_behav * clipped_surrogate(pi / pi_prox)``.

    The trust region is taken around the proximal policy (recomputed by the learner), while
    ``w_behav = pi_prox / pi_behav`` — capped at ``behavior_imp_cap`` — corrects for the stale
    policy that actually sampled the tokens.
    """
    pg, metrics = _ppo_terms(cfg, logprobs, proximal_logprobs, advantages, mask)
    w, bmetrics = behavior_weights(
        proximal_logprobs, behavior_logprobs, mask, cfg.behavior_imp_cap, cfg.behavior_imp_mode
    )
    metrics.update(bmetrics)
    return w * pg, metrics


@register_loss("reinforce")
def reinforce_loss(
    cfg: AlgoConfig,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Plain policy gradient: ``-A * log pi`` per token (no ratio, no clipping)."""
    ratio = torch.exp(_log_ratio(logprobs.detach(), proximal_logprobs, cfg.max_log_ratio))
    metrics = _ratio_metrics(ratio, mask, "ratio")
    metrics["approx_kl"] = masked_mean(
        kl_estimate(logprobs.detach(), proximal_logprobs.detach(), "k3"), mask
    )
    _, bmetrics = behavior_weights(
        proximal_logprobs, behavior_logprobs, mask, cfg.behavior_imp_cap, cfg.behavior_imp_mode
    )
    metrics.update(bmetrics)
    return -advantages.detach() * logprobs, metrics


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
