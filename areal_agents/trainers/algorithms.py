"""The algorithm config and the three calls a learner makes: advantages, policy loss, value loss.

An algorithm is a small frozen dataclass of knobs (:class:`AlgoConfig`) that names an advantage
estimator and a policy loss from the registries in :mod:`~areal_agents.trainers.advantages` and
:mod:`~areal_agents.trainers.losses`. ``AlgoConfig.from_name`` holds the presets, so that the
command line can say ``algo=dapo algo.clip_eps_high=0.3``.

All token tensors are right-padded ``[B, T]`` and the functions are position-agnostic: pass every
token tensor in one alignment (the learner uses the predicted-token positions, already shifted).
``mask`` is 1 on policy tokens only; in multi-turn rows it has zeros in the middle (tool tokens),
and nothing — advantage, loss, KL or entropy — flows through a position where it is 0.

>>> cfg = AlgoConfig.from_name("grpo")
>>> mask = torch.ones(4, 2)
>>> adv, ret = compute_advantages(cfg, torch.tensor([1.0, 0.0, 1.0, 1.0]), mask, "aabb")
>>> [round(a, 4) for a in adv[:, 0].tolist()], ret
([0.7071, -0.7071, 0.0, 0.0], None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.trainers.advantages import (
    AdvantageBatch,
    RunningBaseline,
    get_advantage_estimator,
    group_index,
    masked_mean,
    masked_whiten,
    register_advantage_estimator,
    spread_token_rewards,
)
from areal_agents.trainers.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    aggregate,
    get_loss,
    kl_estimate,
    register_loss,
    value_loss,
)

__all__ = [
    "PRESETS",
    "AlgoConfig",
    "compute_advantages",
    "compute_policy_loss",
    "compute_value_loss",
    "get_advantage_estimator",
    "get_loss",
    "kl_reward_penalty",
    "register_advantage_estimator",
    "register_loss",
]

_BASELINES = ("batch", "running", "none")
_STD_SCOPES = ("group", "batch")
_IMP_MODES = ("truncate", "mask")


@dataclass(frozen=True)
class AlgoConfig:
    """Knobs of one RL algorithm. Select a preset with ``algo=NAME``; override any field."""

    name: str = "grpo"
    """Preset this config came from (a label; the fields below decide the behaviour)."""
    advantage: str = "grpo"
    """Estimator: gae | grpo | dr_grpo | reinforce | rloo | reinforce_pp (or a registered one)."""
    loss: str = "ppo_clip"
    """Policy loss: ppo_clip | decoupled_ppo | reinforce (or registered)."""
    clip_eps_low: float = 0.2
    """PPO clip below 1: ratios under ``1 - clip_eps_low`` stop pushing down a bad token."""
    clip_eps_high: float = 0.2
    """PPO clip above 1 (DAPO clip-higher uses 0.28)."""
    dual_clip_c: float | None = None
    """Dual clip bound ``c > 1`` on negative-advantage tokens (None: off; 3.0 is common)."""
    behavior_imp_cap: float | None = 5.0
    """Cap on the behaviour weight ``pi_prox / pi_behav`` (decoupled_ppo); None: no cap."""
    behavior_imp_mode: str = "truncate"
    """Above the cap: ``truncate`` (min(w, cap), truncated IS) or ``mask`` (drop the token)."""
    aggregation: str = "token_mean"
    """token_mean | seq_mean_token_mean | seq_sum_norm (see ``losses.aggregate``)."""
    norm_tokens: int | None = None
    """Constant per-row length for ``seq_sum_norm`` (Dr. GRPO: the max response length)."""
    kl_coef: float = 0.0
    """Weight of KL(pi || pi_ref); > 0 needs reference log-probs (``needs_ref``)."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 estimator of the KL per token."""
    kl_in_reward: bool = False
    """Fold ``-kl_coef * KL`` into the token rewards (PPO/REINFORCE++) instead of the loss."""
    entropy_coef: float = 0.0
    """Entropy bonus weight: the loss subtracts ``entropy_coef * aggregate(entropy)``."""
    std_normalize: bool = True
    """GRPO: divide centred rewards by their std (Dr. GRPO turns this off)."""
    std_scope: str = "group"
    """GRPO std over the ``group`` or the whole ``batch`` (the centring is always per group)."""
    std_unbiased: bool = True
    """Bessel-corrected std for GRPO (as TRL and torch.std)."""
    adv_eps: float = 1e-6
    """Added to the std before dividing (TRL uses 1e-4)."""
    whiten_advantages: bool = False
    """Whiten the final advantages over all policy tokens of the batch (PPO)."""
    baseline: str = "batch"
    """REINFORCE baseline: batch (mean reward of the batch) | running (EMA) | none."""
    gamma: float = 1.0
    """Discount per policy token (GAE, REINFORCE++)."""
    lam: float = 1.0
    """GAE lambda."""
    use_critic: bool = False
    """Train a value model (required by and only used with ``advantage=gae``)."""
    vf_coef: float = 0.5
    """Weight of the value loss (``compute_value_loss`` returns it already multiplied)."""
    vf_clip: float | None = 0.2
    """Value clipping range around the old values; None: unclipped."""
    max_log_ratio: float = 20.0
    """Log-ratios are clamped to ``±max_log_ratio`` before ``exp`` (no inf/NaN gradients)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal (``filters.drop_uniform_groups``)."""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty over the last N tokens before the length limit (0: off)."""
    overlong_penalty: float = 1.0
    """Largest overlong penalty (reached at the length limit)."""
    mask_truncated: bool = False
    """Overlong filtering: give truncated episodes no loss (``filters.truncation_mask``)."""

    def __post_init__(self) -> None:
        get_advantage_estimator(self.advantage)
        get_loss(self.loss)
        _choose("aggregation", self.aggregation, AGGREGATIONS)
        _choose("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choose("baseline", self.baseline, _BASELINES)
        _choose("std_scope", self.std_scope, _STD_SCOPES)
        _choose("behavior_imp_mode", self.behavior_imp_mode, _IMP_MODES)
        for key in ("clip_eps_low", "clip_eps_high", "kl_coef", "entropy_coef", "vf_coef"):
            if getattr(self, key) < 0:
                raise ConfigError(f"algo.{key}={getattr(self, key)} must be >= 0")
        if self.clip_eps_low >= 1:
            raise ConfigError(f"algo.clip_eps_low={self.clip_eps_low} must be < 1 (try 0.2)")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ConfigError(f"algo.dual_clip_c={self.dual_clip_c} must be > 1 (try 3.0) or none")
        if self.behavior_imp_cap is not None and self.behavior_imp_cap <= 0:
            raise ConfigError(f"algo.behavior_imp_cap={self.behavior_imp_cap} must be > 0 or none")
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"algo.{key}={getattr(self, key)} must be in [0, 1]")
        if self.adv_eps <= 0 or self.max_log_ratio <= 0:
            raise ConfigError("algo.adv_eps and algo.max_log_ratio must be > 0")
        if self.vf_clip is not None and self.vf_clip <= 0:
            raise ConfigError(f"algo.vf_clip={self.vf_clip} must be > 0 or none")
        if self.norm_tokens is not None and self.norm_tokens <= 0:
            raise ConfigError(f"algo.norm_tokens={self.norm_tokens} must be > 0 or none")
        if self.overlong_buffer < 0 or self.overlong_penalty < 0:
            raise ConfigError("algo.overlong_buffer and algo.overlong_penalty must be >= 0")
        if (self.advantage == "gae") != self.use_critic:
            fix = "algo.use_critic=true" if self.advantage == "gae" else "algo.use_critic=false"
            raise ConfigError(
                f"algo.advantage={self.advantage!r} with algo.use_critic={self.use_critic}: "
                f"only GAE uses a critic; set {fix}"
            )

    @property
    def needs_ref(self) -> bool:
        """Whether the learner must compute reference-policy log-probs."""
        return self.kl_coef > 0

    @classmethod
    def from_name(cls, name: str) -> AlgoConfig:
        """The preset ``name``: ppo, grpo, dr_grpo, dapo, reinforce, rloo, reinforce_pp."""
        if name not in PRESETS:
            raise ConfigError(
                f"algo={name!r} is not a known algorithm"
                + did_you_mean(name, PRESETS)
                + f"; choose one of {sorted(PRESETS)}"
            )
        return cls(name=name, **PRESETS[name])

    def replace(self, **changes: Any) -> AlgoConfig:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)


def _choose(key: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(
            f"algo.{key}={value!r} is not allowed"
            + did_you_mean(value, choices)
            + f"; choose one of {list(choices)}"
        )


#: Preset name -> field values (everything else keeps its default). KL is off everywhere by
#: default (no reference model); turn it on with ``algo.kl_coef=0.04`` (GRPO) or
#: ``algo.kl_coef=0.01`` (REINFORCE++, in the reward).
PRESETS: dict[str, dict[str, Any]] = {
    "ppo": dict(
        advantage="gae", loss="ppo_clip", use_critic=True, gamma=1.0, lam=0.95,
        whiten_advantages=True, aggregation="token_mean", kl_in_reward=True, kl_estimator="k1",
    ),
    "grpo": dict(advantage="grpo", loss="ppo_clip", aggregation="seq_mean_token_mean"),
    "dr_grpo": dict(
        advantage="dr_grpo", loss="ppo_clip", std_normalize=False, aggregation="seq_sum_norm"
    ),
    "dapo": dict(
        advantage="grpo", loss="ppo_clip", clip_eps_low=0.2, clip_eps_high=0.28,
        aggregation="token_mean", dynamic_sampling=True, mask_truncated=False,
    ),
    "reinforce": dict(advantage="reinforce", loss="reinforce", baseline="batch"),
    "rloo": dict(advantage="rloo", loss="ppo_clip", aggregation="token_mean"),
    "reinforce_pp": dict(
        advantage="reinforce_pp", loss="ppo_clip", kl_in_reward=True, kl_estimator="k2",
        aggregation="token_mean",
    ),
}  # fmt: skip


def kl_reward_penalty(
    cfg: AlgoConfig, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor
) -> Tensor:
    """``-kl_coef * KL`` per policy token ``[B, T]``: the KL penalty folded into the reward."""
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), cfg.kl_estimator, cfg.max_log_ratio)
    return torch.where(mask.bool(), -cfg.kl_coef * kl, torch.zeros_like(kl))


def compute_advantages(
    cfg: AlgoConfig,
    rewards: Tensor,
    mask: Tensor,
    group_ids: Sequence[str],
    values: Tensor | None = None,
    *,
    behavior_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    baseline: RunningBaseline | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Advantages ``[B, T]`` (0 where ``mask == 0``) and, for GAE, value targets ``[B, T]``.

    ``rewards`` is ``[B]`` (one per sequence, credited to its last policy token) or ``[B, T]``
    token rewards (a reward on a tool token goes to the policy token before it). Sequence-level
    estimators (grpo, dr_grpo, rloo, reinforce) use each row's reward total; token-level ones
    (gae, reinforce_pp) use the rewards token by token. With ``kl_in_reward`` and ``kl_coef > 0``
    pass ``behavior_logprobs`` (the policy that sampled the tokens) and ``ref_logprobs``: the
    penalty ``-kl_coef * KL`` is added on every policy token. ``baseline`` is the trainer's
    :class:`RunningBaseline` for ``baseline=running``. ``group_ids`` is any sequence of ``B``
    hashable labels (samples of one task share one).
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    B = mask.shape[0]
    if rewards.shape[0] != B or len(group_ids) != B:
        raise ValueError(
            f"{B} rows in mask, {rewards.shape[0]} rewards, {len(group_ids)} group ids"
        )
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    maskf = mask.to(dtype)
    rewards = rewards.to(dtype).detach()
    token_rewards = spread_token_rewards(rewards, maskf)  # [B, T]
    # A row's total reward (kept even for a row without policy tokens: it still counts in its
    # group's baseline).
    seq_rewards = rewards if rewards.dim() == 1 else rewards.sum(dim=1)  # [B]
    if cfg.kl_in_reward and cfg.kl_coef > 0:
        if behavior_logprobs is None or ref_logprobs is None:
            raise ValueError("kl_in_reward needs behavior_logprobs= and ref_logprobs= ([B, T])")
        penalty = kl_reward_penalty(cfg, behavior_logprobs, ref_logprobs, maskf)  # [B, T]
        token_rewards = token_rewards + penalty
        seq_rewards = seq_rewards + penalty.sum(dim=1)
    if cfg.advantage == "gae" and values is None:
        raise ValueError("algo.advantage='gae' needs values= from the critic ([B, T])")
    batch = AdvantageBatch(
        token_rewards=token_rewards,
        seq_rewards=seq_rewards,
        mask=maskf,
        group_index=group_index(list(group_ids), device=mask.device),
        values=None if values is None else values.detach().to(dtype),
        baseline=baseline,
    )
    adv, returns = get_advantage_estimator(cfg.advantage)(cfg, batch)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, maskf, eps=cfg.adv_eps)
    adv = torch.where(mask.bool(), adv, torch.zeros_like(adv)).detach()
    if returns is not None:
        returns = torch.where(mask.bool(), returns, torch.zeros_like(returns)).detach()
    return adv, returns


def compute_policy_loss(
    cfg: AlgoConfig,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
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
    ``kl_in_reward`` (it is in the advantages instead). ``normalizer`` overrides the
    aggregation's denominator for gradient accumulation (see ``losses.aggregate``).
    Masked positions may hold anything, even NaN or inf: they contribute exactly nothing.

    Metrics: keys under ``loss/`` (``loss/policy``, ``loss/kl``, ``loss/entropy``,
    ``loss/total``) use the loss's aggregation and ``normalizer``, so micro-batch values *add
    up*; every other key (``ratio/*``, ``clip/*``, ``behavior/*``, ``approx_kl``, ``kl_ref``,
    ``entropy``, ``advantage/mean``) is a token mean over this call's mask.
    """
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
    lp = torch.where(m, logprobs, zero)
    prox = torch.where(m, proximal_logprobs.detach().to(lp.dtype), zero)
    behav = torch.where(m, behavior_logprobs.detach().to(lp.dtype), zero)
    adv = torch.where(m, advantages.detach().to(lp.dtype), zero)

    def agg(x: Tensor) -> Tensor:
        return aggregate(
            x, maskf, cfg.aggregation, norm_tokens=cfg.norm_tokens, normalizer=normalizer
        )

    per_token, metrics = get_loss(cfg.loss)(cfg, lp, prox, behav, adv, maskf)
    pg_loss = agg(torch.where(m, per_token, zero))
    loss = pg_loss
    metrics["loss/policy"] = pg_loss.detach()
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        if ref_logprobs is None:
            raise ValueError(f"algo.kl_coef={cfg.kl_coef} needs ref_logprobs= ([B, T])")
        ref = torch.where(m, ref_logprobs.detach().to(lp.dtype), zero)
        kl = torch.where(m, kl_estimate(lp, ref, cfg.kl_estimator, cfg.max_log_ratio), zero)
        kl_loss = agg(kl)
        loss = loss + cfg.kl_coef * kl_loss
        metrics["loss/kl"] = kl_loss.detach()
        metrics["kl_ref"] = masked_mean(kl.detach(), maskf)
    elif ref_logprobs is not None:
        ref = torch.where(m, ref_logprobs.detach().to(lp.dtype), zero)
        kl = kl_estimate(lp.detach(), ref, cfg.kl_estimator, cfg.max_log_ratio)
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
    metrics["advantage/mean"] = masked_mean(adv, maskf)
    metrics["loss/total"] = loss.detach()
    return loss, metrics


def compute_value_loss(
    cfg: AlgoConfig,
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
