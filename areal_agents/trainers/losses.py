"""Policy losses: pure tensor functions chosen by name, and the one call a learner makes.

A policy loss maps the three log-probabilities of off-policy training, kept apart and named,

* ``logprobs`` — the current policy (requires grad),
* ``proximal_logprobs`` — the policy the trust region is taken around (no grad),
* ``behavior_logprobs`` — the policy that sampled the tokens, from the rollout (no grad),

plus ``advantages`` and ``mask`` (all ``[B, T]``) to a *per-token* loss ``[B, T]`` and a dict of
detached metric tensors. Each loss declares, when it is registered, what its proximal policy is
(:data:`PROXIMAL_KINDS`), so that a learner asks the loss instead of branching on its name:

* ``"behavior"`` — the policy that sampled the tokens (textbook PPO: the ratio is
  ``pi / pi_behav``); nothing to compute;
* ``"step_start"`` — the weights at the start of the training step (decoupled PPO): with one
  update per step they are the current weights, detached; with more, the learner recomputes
  them in a no-grad pass before the first update (:attr:`LossSpec.needs_recompute`);
* ``"current"`` — the current weights, detached (the loss uses it for metrics only).

Averaging is a separate, explicit step (:func:`aggregate`), with its denominator computed by
:func:`aggregation_normalizer`, so that every loss combines with every aggregation and a learner
can normalise micro-batches by their whole minibatch. Losses are position-agnostic: any
alignment of ``T`` works as long as all inputs share it. Nothing here calls ``.item()``.

Adding a loss is one function and one line::

    @register_loss("my_pg", proximal="current")
    def my_pg(cfg, logprobs, proximal_logprobs, behavior_logprobs, advantages, mask):
        return -advantages * logprobs, {}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.trainers.aggregation import AGGREGATIONS, aggregate, aggregation_normalizer
from areal_agents.trainers.corrections import behavior_weights
from areal_agents.trainers.masked import masked_max, masked_mean, masked_min

__all__ = [
    "AGGREGATIONS",
    "AUTO_LOSS",
    "KL_ESTIMATORS",
    "KL_ROWS",
    "POLICY_LOSSES",
    "PROXIMAL_KINDS",
    "LossKnobs",
    "LossSpec",
    "PolicyLoss",
    "aggregate",
    "aggregation_normalizer",
    "behavior_weights",
    "clipped_surrogate",
    "compute_policy_loss",
    "decoupled_ppo_loss",
    "get_loss",
    "kl_estimate",
    "kl_row_mask",
    "ppo_clip_loss",
    "register_loss",
    "reinforce_loss",
    "resolve_loss",
]

#: Schulman's estimators of KL(pi || pi_ref) from samples of pi.
KL_ESTIMATORS = ("k1", "k2", "k3")
#: Which rows the KL to the reference is a loss on (``algo.kl_rows``): every row, or only the rows
#: whose advantage is 0 on every policy token (no policy-gradient signal).
KL_ROWS = ("all", "no_signal")
#: What a loss may declare as its proximal policy (see the module docstring).
PROXIMAL_KINDS = ("behavior", "step_start", "current")
Proximal = Literal["behavior", "step_start", "current"]


class LossKnobs(Protocol):
    """The algorithm settings a policy loss reads (``AlgoConfig`` provides them)."""

    @property
    def loss(self) -> str: ...
    @property
    def clip_eps_low(self) -> float: ...
    @property
    def clip_eps_high(self) -> float: ...
    @property
    def dual_clip_c(self) -> float | None: ...
    @property
    def behavior_imp_cap(self) -> float | None: ...
    @property
    def behavior_imp_mode(self) -> str: ...
    @property
    def behavior_imp_level(self) -> str: ...
    @property
    def behavior_imp_agg(self) -> str: ...
    @property
    def behavior_imp_floor(self) -> float | None: ...
    @property
    def aggregation(self) -> str: ...
    @property
    def norm_tokens(self) -> int | None: ...
    @property
    def kl_coef(self) -> float: ...
    @property
    def kl_estimator(self) -> str: ...
    @property
    def kl_rows(self) -> str: ...
    @property
    def kl_in_reward(self) -> bool: ...
    @property
    def entropy_coef(self) -> float: ...
    @property
    def max_log_ratio(self) -> float: ...


def _log_ratio(a: Tensor, b: Tensor, limit: float | None) -> Tensor:
    lr = a - b
    return lr if limit is None else lr.clamp(-limit, limit)


def kl_row_mask(kl_rows: str, advantages: Tensor, mask: Tensor) -> Tensor:
    """``[B, 1]`` bool: the rows the KL to the reference is a loss on (``algo.kl_rows``).

    ``all``: every row. ``no_signal``: the rows whose advantage is 0 on every policy token of
    ``mask`` (GRPO's groups whose episodes all earned the same reward), so the reference holds
    the policy where the rewards teach nothing (the answers it already gets right, or never does)
    and leaves the rows it learns from free: Learning without Forgetting's anchor (Li & Hoiem,
    2016), the old model's outputs kept on the data the new objective says nothing about.

    >>> adv = torch.tensor([[0.0, 0.7], [0.0, 0.0]]); m = torch.ones(2, 2, dtype=torch.bool)
    >>> kl_row_mask("no_signal", adv, m).flatten().tolist(), kl_row_mask("all", adv, m).shape
    ([False, True], torch.Size([2, 1]))"""
    if kl_rows == "all":
        return torch.ones(advantages.shape[0], 1, dtype=torch.bool, device=advantages.device)
    if kl_rows != "no_signal":
        raise ConfigError(f"algo.kl_rows={kl_rows!r}; choose one of {KL_ROWS}")
    return ~((advantages != 0) & mask.bool()).any(dim=1, keepdim=True)


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
    [LossKnobs, Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, dict[str, Tensor]]
]


@dataclass(frozen=True)
class LossSpec:
    """A registered policy loss and what it declares it needs."""

    name: str
    fn: PolicyLoss
    proximal: Proximal = "step_start"
    """Which policy ``proximal_logprobs`` is (module docstring)."""

    def __call__(
        self, cfg: LossKnobs, logprobs: Tensor, proximal_logprobs: Tensor,
        behavior_logprobs: Tensor, advantages: Tensor, mask: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
        return self.fn(cfg, logprobs, proximal_logprobs, behavior_logprobs, advantages, mask)

    def needs_recompute(self, updates_per_step: int) -> bool:
        """Whether the learner must recompute proximal log-probs before the first update."""
        return self.proximal == "step_start" and updates_per_step > 1

    def proximal_logprobs(self, logprobs: Tensor, behavior_logprobs: Tensor) -> Tensor:
        """The proximal log-probs when none were recomputed (one update per step)."""
        return behavior_logprobs if self.proximal == "behavior" else logprobs.detach()


POLICY_LOSSES: dict[str, LossSpec] = {}

#: ``algo.loss=auto`` (every preset's choice but reinforce): the loss of each training mode.
#: Async trains on samples up to ``max_staleness`` versions old, and there clipping the ratio
#: against the sampling policy (``ppo_clip``) throws gradient away: the ratio drifts from 1 by
#: the staleness alone, so tokens are clipped before the current step moved anything. The
#: decoupled loss takes the trust region around the step-start policy and reweights by
#: ``pi_prox / pi_behav`` instead; measured (``benchmarks/decoupled_vs_naive.py``, README
#: section 2) it learned as fast at staleness 4 and 8 as at 0, while ``ppo_clip`` fell behind
#: with staleness. In sync training the sampler *is* the step-start policy, the two losses
#: coincide, and ``ppo_clip`` needs no proximal pass. Without a mode ``auto`` is ``ppo_clip``.
AUTO_LOSS: dict[str, str] = {"async": "decoupled_ppo", "sync": "ppo_clip"}


def resolve_loss(name: str, mode: str | None = None) -> str:
    """The registered loss ``algo.loss=name`` means in ``trainer.mode=mode`` (``auto``:
    :data:`AUTO_LOSS`; no mode: sync's); any other name is returned as it is.

    >>> resolve_loss("auto", "async"), resolve_loss("auto", "sync"), resolve_loss("reinforce")
    ('decoupled_ppo', 'ppo_clip', 'reinforce')
    """
    if name != "auto":
        return name
    return AUTO_LOSS["async" if mode == "async" else "sync"]


def register_loss(
    name: str, *, proximal: Proximal = "step_start"
) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make a per-token policy loss selectable as ``algo.loss=NAME``.

    ``proximal`` declares the policy its ratio or metrics are taken against (module docstring).
    """
    if proximal not in PROXIMAL_KINDS:
        raise ConfigError(f"loss {name!r}: proximal={proximal!r}; choose one of {PROXIMAL_KINDS}")

    def deco(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES and POLICY_LOSSES[name].fn is not fn:
            raise ConfigError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = LossSpec(name, fn, proximal)
        return fn

    return deco


def get_loss(name: str) -> LossSpec:
    """The policy loss registered as ``name`` (``auto``: :func:`resolve_loss` without a mode);
    unknown names fail with a suggestion."""
    try:
        return POLICY_LOSSES[resolve_loss(name)]
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


def _behavior(
    cfg: LossKnobs, proximal_logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """The corrected behaviour weights ``cfg`` asks for (``trainers/corrections.py``)."""
    return behavior_weights(
        proximal_logprobs,
        behavior_logprobs,
        mask,
        cfg.behavior_imp_cap,
        cfg.behavior_imp_mode,
        level=cfg.behavior_imp_level,
        agg=cfg.behavior_imp_agg,
        floor=cfg.behavior_imp_floor,
    )


def _ppo_terms(
    cfg: LossKnobs, logprobs: Tensor, proximal_logprobs: Tensor, advantages: Tensor, mask: Tensor
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


@register_loss("ppo_clip", proximal="behavior")
def ppo_clip_loss(
    cfg: LossKnobs,
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
    _, bmetrics = _behavior(cfg, proximal_logprobs, behavior_logprobs, mask)
    metrics.update(bmetrics)
    return pg, metrics


@register_loss("decoupled_ppo", proximal="step_start")
def decoupled_ppo_loss(
    cfg: LossKnobs,
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
    w, bmetrics = _behavior(cfg, proximal_logprobs, behavior_logprobs, mask)
    metrics.update(bmetrics)
    return w * pg, metrics


@register_loss("reinforce", proximal="current")
def reinforce_loss(
    cfg: LossKnobs,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy gradient with the off-policy correction: ``-w * A * log pi`` per token, no ratio
    and no clipping. ``w`` is the behaviour weight ``pi / pi_behav`` of the current policy
    (detached) with the configured correction (``algo.behavior_imp_*``,
    :mod:`~areal_agents.trainers.corrections`): 1 on fresh samples (sync), and in async the
    importance weight that makes a stale sample's gradient that of the current policy."""
    ratio = torch.exp(_log_ratio(logprobs.detach(), proximal_logprobs, cfg.max_log_ratio))
    metrics = _ratio_metrics(ratio, mask, "ratio")
    metrics["approx_kl"] = masked_mean(
        kl_estimate(logprobs.detach(), proximal_logprobs.detach(), "k3"), mask
    )
    w, bmetrics = _behavior(cfg, proximal_logprobs, behavior_logprobs, mask)
    metrics.update(bmetrics)
    return -w * advantages.detach() * logprobs, metrics


def compute_policy_loss(
    cfg: LossKnobs,
    logprobs: Tensor,
    proximal_logprobs: Tensor | None,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    *,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar policy loss and detached metrics.

    ``loss = agg(policy_loss) + kl_coef * agg(KL(pi || ref)) - entropy_coef * agg(entropy)``
    with ``agg = aggregate(., mask, cfg.aggregation)``; the KL term is left out when
    ``kl_in_reward`` (it is in the advantages instead). ``proximal_logprobs=None`` lets the loss
    choose the proximal policy it declared (:meth:`LossSpec.proximal_logprobs`): pass a tensor
    only when it was recomputed. ``normalizer`` overrides the aggregation's denominator for
    gradient accumulation (:func:`aggregation_normalizer`). Masked positions may hold anything,
    even NaN or inf: they contribute exactly nothing.

    Metrics: keys under ``loss/`` (``loss/policy``, ``loss/kl``, ``loss/entropy``,
    ``loss/total``) use the loss's aggregation and ``normalizer``, so micro-batch values *add
    up*; every other key (``ratio/*``, ``clip/*``, ``behavior/*``, ``approx_kl``, ``kl_ref``,
    ``entropy``, ``advantage/mean``) is a token mean over this call's mask.
    """
    spec = get_loss(cfg.loss)
    if proximal_logprobs is None:
        proximal_logprobs = spec.proximal_logprobs(logprobs, behavior_logprobs)
    shape = logprobs.shape
    named = {"proximal_logprobs": proximal_logprobs, "behavior_logprobs": behavior_logprobs,
             "advantages": advantages, "mask": mask}  # fmt: skip
    for name, t in named.items():
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logprobs {tuple(shape)}")
    maskf = mask.to(logprobs.dtype)
    m = mask.bool()
    # Zero the masked positions first, so that garbage (inf, NaN) there cannot leak a gradient.
    zero = torch.zeros_like(logprobs)
    dtype = logprobs.dtype
    logprobs = torch.where(m, logprobs, zero)
    proximal_logprobs = torch.where(m, proximal_logprobs.detach().to(dtype), zero)
    behavior_logprobs = torch.where(m, behavior_logprobs.detach().to(dtype), zero)
    advantages = torch.where(m, advantages.detach().to(dtype), zero)

    def agg(x: Tensor) -> Tensor:
        return aggregate(
            x, maskf, cfg.aggregation, norm_tokens=cfg.norm_tokens, normalizer=normalizer
        )

    per_token, metrics = spec(
        cfg, logprobs, proximal_logprobs, behavior_logprobs, advantages, maskf
    )
    pg_loss = agg(torch.where(m, per_token, zero))
    loss = pg_loss
    metrics["loss/policy"] = pg_loss.detach()
    if ref_logprobs is not None:
        ref_logprobs = torch.where(m, ref_logprobs.detach().to(dtype), zero)
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        if ref_logprobs is None:
            raise ValueError(f"algo.kl_coef={cfg.kl_coef} needs ref_logprobs= ([B, T])")
        kl = kl_estimate(logprobs, ref_logprobs, cfg.kl_estimator, cfg.max_log_ratio)
        kl = torch.where(m, kl, zero)
        anchored = kl_row_mask(cfg.kl_rows, advantages, m)  # [B, 1]
        kl_loss = agg(torch.where(anchored, kl, zero))
        loss = loss + cfg.kl_coef * kl_loss
        metrics["loss/kl"] = kl_loss.detach()
        metrics["kl_ref"] = masked_mean(kl.detach(), maskf)
        metrics["kl/anchored_frac"] = masked_mean(anchored.expand_as(kl).to(dtype), maskf)
    elif ref_logprobs is not None:
        kl = kl_estimate(logprobs.detach(), ref_logprobs, cfg.kl_estimator, cfg.max_log_ratio)
        metrics["kl_ref"] = masked_mean(kl, maskf)
    if entropy is not None:
        ent = torch.where(m, entropy, zero)
        if cfg.entropy_coef > 0:
            ent_loss = agg(ent)
            loss = loss - cfg.entropy_coef * ent_loss
            metrics["loss/entropy"] = ent_loss.detach()
        metrics["entropy"] = masked_mean(ent.detach(), maskf)
    elif cfg.entropy_coef > 0:
        raise ValueError(f"algo.entropy_coef={cfg.entropy_coef} needs entropy= ([B, T])")
    metrics["advantage/mean"] = masked_mean(advantages, maskf)
    metrics["loss/total"] = loss.detach()
    return loss, metrics
