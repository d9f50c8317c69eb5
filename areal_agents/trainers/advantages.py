"""Advantage estimators: pure tensor functions chosen by name from a registry.

Every estimator takes the algorithm config and an :class:`AdvantageBatch` and returns
``(advantages [B, T], returns [B, T] | None)``. ``advantages`` is exactly 0 wherever
``mask == 0``: prompt, tool-output and padding tokens never carry credit.

Shapes and positions. Token-level tensors are right-padded ``[B, T]``; a multi-turn trajectory
has zeros *inside* its mask (tool and template tokens between turns). Estimators are
position-agnostic: they only see which positions are policy tokens and in what order, so the
caller may align ``T`` to the input ids or to the shifted (predicted-token) positions, as long as
rewards, values and mask share one alignment. Temporal estimators (GAE, REINFORCE++ returns)
treat the policy tokens of a row, in order, as the time steps: the step after a policy token is
the next *policy* token, skipping tool tokens, and the last policy token ends the episode.

Each estimator declares whether it reads critic values (``needs_critic``), so that a learner
trains a value model exactly when the chosen estimator uses one. Adding an estimator is one
function and one line::

    @register_advantage_estimator("my_adv")
    def my_adv(cfg, batch):
        return batch.seq_rewards[:, None] * batch.mask, None
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.trainers.losses import kl_estimate
from areal_agents.trainers.masked import masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageBatch",
    "AdvantageEstimator",
    "AdvantageKnobs",
    "EstimatorSpec",
    "RunningBaseline",
    "compute_advantages",
    "discounted_returns",
    "gae",
    "get_advantage_estimator",
    "group_index",
    "group_stats",
    "kl_reward_penalty",
    "register_advantage_estimator",
    "spread_token_rewards",
]


class AdvantageKnobs(Protocol):
    """The algorithm settings advantage estimation reads (``AlgoConfig`` provides them)."""

    @property
    def advantage(self) -> str: ...
    @property
    def std_normalize(self) -> bool: ...
    @property
    def std_scope(self) -> str: ...
    @property
    def std_unbiased(self) -> bool: ...
    @property
    def adv_eps(self) -> float: ...
    @property
    def whiten_advantages(self) -> bool: ...
    @property
    def positive_scale(self) -> float: ...
    @property
    def negative_scale(self) -> float: ...
    @property
    def baseline(self) -> str: ...
    @property
    def gamma(self) -> float: ...
    @property
    def lam(self) -> float: ...
    @property
    def kl_coef(self) -> float: ...
    @property
    def kl_in_reward(self) -> bool: ...
    @property
    def kl_estimator(self) -> str: ...
    @property
    def max_log_ratio(self) -> float: ...


# --- groups ----------------------------------------------------------------------------------


def group_index(group_ids: Sequence[Any] | Tensor, device: torch.device | None = None) -> Tensor:
    """Integer group index per sample, numbered in order of first appearance.

    ``group_ids`` holds one hashable id per sample (strings, integers), or is a 1-D tensor of
    ids; tensor elements are compared by value (``tensor([0, 0, 1])`` is two groups), not by
    identity as hashing them would.

    >>> group_index(["b", "a", "b"]).tolist()
    [0, 1, 0]
    >>> group_index(torch.tensor([7, 7, 3])).tolist()
    [0, 0, 1]
    """
    if isinstance(group_ids, Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")
        group_ids = group_ids.tolist()
    seen: dict[Any, int] = {}
    idx = []
    for g in group_ids:
        if isinstance(g, Tensor):  # a list of 0-d tensors: compare their values
            g = g.item()
        idx.append(seen.setdefault(g, len(seen)))
    return torch.tensor(idx, dtype=torch.long, device=device)


def group_stats(
    values: Tensor, index: Tensor, unbiased: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample ``(group mean, group std, group size)`` of a ``[B]`` tensor.

    The std of a group of one is 0 (it has no spread to scale by).
    """
    num = int(index.max().item()) + 1 if index.numel() else 0
    zeros = torch.zeros(num, dtype=values.dtype, device=values.device)
    size = zeros.index_add(0, index, torch.ones_like(values))  # [G]
    mean = zeros.index_add(0, index, values) / size  # [G]
    dev2 = zeros.index_add(0, index, (values - mean[index]) ** 2)  # [G]
    denom = (size - 1).clamp(min=1.0) if unbiased else size
    std = torch.where(size > 1, (dev2 / denom).sqrt(), torch.zeros_like(size))
    return mean[index], std[index], size[index]


# --- token-level rewards ------------------------------------------------------------------------


def spread_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Put rewards on policy tokens: ``[B]`` goes to each row's last policy token.

    A ``[B, T]`` reward that sits on a non-policy position (a tool result scored by the
    environment) is credited to the nearest policy token *before* it — the action that caused
    it; rewards before a row's first policy token go to its first policy token. Rows without
    policy tokens get all zeros. The row totals are preserved for rows with policy tokens.
    """
    maskb = mask.bool()
    B, T = mask.shape
    pos = torch.arange(T, device=mask.device).expand(B, T)
    has_any = maskb.any(dim=1)  # [B]
    # index of the most recent policy token at or before each position (-1 if none yet)
    last_seen = torch.where(maskb, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # [B, T]
    first = torch.where(maskb, pos, torch.full_like(pos, T)).min(dim=1).values  # [B]
    if rewards.dim() == 1:
        target = torch.where(maskb, pos, torch.full_like(pos, -1)).max(dim=1).values  # [B]
        out = torch.zeros(B, T, dtype=rewards.dtype, device=rewards.device)
        rows = torch.arange(B, device=mask.device)[has_any]
        out[rows, target[has_any]] = rewards[has_any]
        return out
    if rewards.shape != mask.shape:
        raise ValueError(
            f"token rewards have shape {tuple(rewards.shape)}, mask {tuple(mask.shape)}"
        )
    target = torch.where(last_seen >= 0, last_seen, first[:, None].expand(B, T))  # [B, T]
    target = target.clamp(max=T - 1)
    out = torch.zeros_like(rewards).scatter_add(1, target, rewards)
    return torch.where(has_any[:, None], out, torch.zeros_like(out))


def _compact(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Permutation that moves each row's policy tokens to the left, in order, and their mask."""
    order = torch.argsort((~mask.bool()).to(torch.int8), dim=1, stable=True)  # [B, T]
    return order, mask.bool().gather(1, order)


def _backward_scan(deltas: Tensor, mask: Tensor, decay: float) -> Tensor:
    """``out_t = deltas_t + decay * out_{t'}`` over policy tokens, ``t'`` the next policy token."""
    order, cmask = _compact(mask)
    d = deltas.gather(1, order) * cmask  # [B, T] left-aligned
    out = torch.zeros_like(d)
    running = torch.zeros_like(d[:, 0])
    for t in range(d.shape[1] - 1, -1, -1):
        running = (d[:, t] + decay * running) * cmask[:, t]
        out[:, t] = running
    return torch.zeros_like(out).scatter(1, order, out) * mask


def _next_policy_values(values: Tensor, mask: Tensor) -> Tensor:
    """Value at the next policy token of the same row (0 after the last one)."""
    order, cmask = _compact(mask)
    v = values.gather(1, order) * cmask  # [B, T]
    nxt = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)  # [B, T]
    nxt = nxt * torch.cat([cmask[:, 1:], torch.zeros_like(cmask[:, :1])], dim=1)
    return torch.zeros_like(nxt).scatter(1, order, nxt) * mask


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the policy tokens of each row.

    ``delta_t = r_t + gamma * V(next policy token) - V_t`` with ``V = 0`` after the last policy
    token; ``A_t = delta_t + gamma * lam * A_next``; ``returns = A + V``. All ``[B, T]``, 0 off
    the mask.
    """
    values = values.detach() * mask
    deltas = token_rewards + gamma * _next_policy_values(values, mask) - values  # [B, T]
    adv = _backward_scan(deltas * mask, mask, gamma * lam)  # [B, T]
    return adv, (adv + values) * mask


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """``G_t = sum_{s >= t} gamma^(k(s) - k(t)) r_s`` over the policy tokens of each row."""
    return _backward_scan(token_rewards * mask, mask, gamma)


# --- a running baseline (the one piece of state an estimator may use) --------------------------


class RunningBaseline:
    """Exponential moving average of the batch-mean reward, for REINFORCE.

    The trainer owns it (and saves :meth:`state_dict` in checkpoints); an estimator reads the
    baseline *before* this batch, then folds the batch in.
    """

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 <= decay < 1.0:
            raise ConfigError(f"RunningBaseline decay={decay} must be in [0, 1)")
        self.decay = decay
        self.value = 0.0
        self.count = 0

    def update(self, batch_mean: float) -> None:
        """Fold one batch mean in (the first batch sets the value outright)."""
        if self.count == 0:
            self.value = float(batch_mean)
        else:
            self.value = self.decay * self.value + (1.0 - self.decay) * float(batch_mean)
        self.count += 1

    def state_dict(self) -> dict[str, float]:
        return {"decay": self.decay, "value": self.value, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.decay, self.value, self.count = state["decay"], state["value"], int(state["count"])


# --- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageBatch:
    """What an estimator sees. All token tensors are ``[B, T]``, right-padded.

    ``token_rewards`` holds every reward on a policy token (the sequence reward on the last one,
    per-token terms such as a KL penalty on each); ``seq_rewards`` is its row sum, ``[B]``.
    """

    token_rewards: Tensor
    seq_rewards: Tensor
    mask: Tensor
    group_index: Tensor
    values: Tensor | None = None
    baseline: RunningBaseline | None = None


AdvantageEstimator = Callable[[AdvantageKnobs, AdvantageBatch], tuple[Tensor, Tensor | None]]


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered advantage estimator and what it declares it needs."""

    name: str
    fn: AdvantageEstimator
    needs_critic: bool = False
    """Whether it reads critic values (the learner then trains a value model)."""
    groupwise: bool = False
    """Whether it compares the samples of a group (then a group needs two or more)."""

    def __call__(self, cfg: AdvantageKnobs, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
        return self.fn(cfg, batch)


ADVANTAGE_ESTIMATORS: dict[str, EstimatorSpec] = {}


def register_advantage_estimator(
    name: str, *, needs_critic: bool = False, groupwise: bool = False
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: make an estimator selectable as ``algo.advantage=NAME``.

    ``needs_critic=True`` declares that it reads ``batch.values`` from a critic;
    ``groupwise=True`` that it compares the samples of a group with each other.
    """

    def deco(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS[name].fn is not fn:
            raise ConfigError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = EstimatorSpec(name, fn, needs_critic, groupwise)
        return fn

    return deco


def get_advantage_estimator(name: str) -> EstimatorSpec:
    """The estimator registered as ``name``; unknown names fail with a suggestion."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ConfigError(
            f"algo.advantage={name!r} is not a known advantage estimator"
            + did_you_mean(name, ADVANTAGE_ESTIMATORS)
            + f"; choose one of {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None


def _broadcast(seq_adv: Tensor, mask: Tensor) -> Tensor:
    return seq_adv[:, None] * mask.to(seq_adv.dtype)  # [B, T]


@register_advantage_estimator("gae", needs_critic=True)
def gae_estimator(cfg: AdvantageKnobs, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """PPO: GAE(gamma, lam) on a critic's values; also returns the value targets."""
    if batch.values is None:
        raise ValueError("advantage 'gae' needs critic values: pass values=[B, T]")
    return gae(batch.token_rewards, batch.values, batch.mask, cfg.gamma, cfg.lam)


def _grpo(cfg: AdvantageKnobs, batch: AdvantageBatch, scale: bool) -> Tensor:
    r = batch.seq_rewards  # [B]
    mean, std, _ = group_stats(r, batch.group_index, unbiased=cfg.std_unbiased)  # [B] each
    adv = r - mean  # [B]
    if scale:
        if cfg.std_scope == "batch":
            std = r.std(unbiased=cfg.std_unbiased) if r.numel() > 1 else torch.zeros_like(r)
        adv = adv / (std + cfg.adv_eps)
    return _broadcast(adv, batch.mask)


@register_advantage_estimator("grpo", groupwise=True)
def grpo_estimator(cfg: AdvantageKnobs, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """GRPO: ``(r - group mean) / (group std + eps)`` (std scaling when ``std_normalize``)."""
    return _grpo(cfg, batch, scale=cfg.std_normalize), None


@register_advantage_estimator("dr_grpo", groupwise=True)
def dr_grpo_estimator(cfg: AdvantageKnobs, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """Dr. GRPO: ``r - group mean``, never divided by the std."""
    return _grpo(cfg, batch, scale=False), None


@register_advantage_estimator("rloo", groupwise=True)
def rloo_estimator(cfg: AdvantageKnobs, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """RLOO: ``r_i - mean_{j != i} r_j`` within the group (0 for a group of one)."""
    r = batch.seq_rewards  # [B]
    mean, _, size = group_stats(r, batch.group_index)  # [B] each
    adv = torch.where(size > 1, (r - mean) * size / (size - 1).clamp(min=1.0), torch.zeros_like(r))
    return _broadcast(adv, batch.mask), None


@register_advantage_estimator("reinforce")
def reinforce_estimator(cfg: AdvantageKnobs, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """REINFORCE: ``r - b`` with ``b`` from ``cfg.baseline``: batch mean, running mean, or 0."""
    r = batch.seq_rewards  # [B]
    if cfg.baseline == "batch":
        b: Tensor | float = r.mean()
    elif cfg.baseline == "running":
        if batch.baseline is None:
            raise ValueError("algo.baseline='running' needs a RunningBaseline: pass baseline=")
        b = batch.baseline.value if batch.baseline.count else r.mean()
        batch.baseline.update(float(r.mean().item()))
    else:
        b = 0.0
    return _broadcast(r - b, batch.mask), None


@register_advantage_estimator("reinforce_pp")
def reinforce_pp_estimator(
    cfg: AdvantageKnobs, batch: AdvantageBatch
) -> tuple[Tensor, Tensor | None]:
    """REINFORCE++: token returns (KL penalty folded in per token), whitened over the batch."""
    returns = discounted_returns(batch.token_rewards, batch.mask, cfg.gamma)  # [B, T]
    return masked_whiten(returns, batch.mask, eps=cfg.adv_eps), None


# --- the call a learner makes ----------------------------------------------------------------


def kl_reward_penalty(
    cfg: AdvantageKnobs, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor
) -> Tensor:
    """``-kl_coef * KL`` per policy token ``[B, T]``: the KL penalty folded into the reward."""
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), cfg.kl_estimator, cfg.max_log_ratio)
    return torch.where(mask.bool(), -cfg.kl_coef * kl, torch.zeros_like(kl))


def compute_advantages(
    cfg: AdvantageKnobs,
    rewards: Tensor,
    mask: Tensor,
    group_ids: Sequence[Any] | Tensor,
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
    hashable labels, or a ``[B]`` tensor of ids (samples of one task share one).
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
    estimator = get_advantage_estimator(cfg.advantage)
    if estimator.needs_critic and values is None:
        raise ValueError(f"algo.advantage={cfg.advantage!r} needs values= from the critic ([B, T])")
    batch = AdvantageBatch(
        token_rewards=token_rewards,
        seq_rewards=seq_rewards,
        mask=maskf,
        group_index=group_index(group_ids, device=mask.device),
        values=None if values is None else values.detach().to(dtype),
        baseline=baseline,
    )
    adv, returns = estimator(cfg, batch)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, maskf, eps=cfg.adv_eps)
    if cfg.positive_scale != 1.0 or cfg.negative_scale != 1.0:  # a tilt by sign, kept last
        adv = adv * torch.where(adv > 0, cfg.positive_scale, cfg.negative_scale)
    adv = torch.where(mask.bool(), adv, torch.zeros_like(adv)).detach()
    if returns is not None:
        returns = torch.where(mask.bool(), returns, torch.zeros_like(returns)).detach()
    return adv, returns
