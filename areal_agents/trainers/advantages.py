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

Adding an estimator is one function and one line::

    @register_advantage_estimator("my_adv")
    def my_adv(cfg, batch):
        return batch.seq_rewards[:, None] * batch.mask, None
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from areal_agents.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from areal_agents.trainers.algorithms import AlgoConfig

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageBatch",
    "AdvantageEstimator",
    "RunningBaseline",
    "discounted_returns",
    "gae",
    "get_advantage_estimator",
    "group_index",
    "group_stats",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_advantage_estimator",
    "spread_token_rewards",
]


# --- masked statistics -------------------------------------------------------------------------


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is 1 (``x`` off the mask may be anything finite or not)."""
    xm = torch.where(mask.bool(), x, torch.zeros_like(x))
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over ``mask == 1`` (0 where the mask is empty, never NaN).

    >>> masked_mean(torch.tensor([1.0, 2.0, 9.0]), torch.tensor([1, 1, 0]))
    tensor(1.5000)
    """
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all ``mask == 1`` entries (Bessel-corrected when ``unbiased``)."""
    mean = masked_mean(x, mask)
    count = mask.to(x.dtype).sum()
    var = masked_sum((x - mean) ** 2, mask) / count.clamp(min=1.0)
    if unbiased:
        var = var * count / (count - 1).clamp(min=1.0)
    return var


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8, shift_mean: bool = True) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked entries; 0 off the mask."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) if shift_mean else x
    out = out * torch.rsqrt(var + eps)
    return torch.where(mask.bool(), out, torch.zeros_like(out))


# --- groups ----------------------------------------------------------------------------------


def group_index(group_ids: Sequence[str], device: torch.device | None = None) -> Tensor:
    """Integer group index per sample, numbered in order of first appearance.

    >>> group_index(["b", "a", "b"]).tolist()
    [0, 1, 0]
    """
    seen: dict[str, int] = {}
    idx = [seen.setdefault(g, len(seen)) for g in group_ids]
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


AdvantageEstimator = Callable[["AlgoConfig", AdvantageBatch], tuple[Tensor, Tensor | None]]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: make an estimator selectable as ``algo.advantage=NAME``."""

    def deco(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS[name] is not fn:
            raise ConfigError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


def get_advantage_estimator(name: str) -> AdvantageEstimator:
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


@register_advantage_estimator("gae")
def gae_estimator(cfg: AlgoConfig, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """PPO: GAE(gamma, lam) on a critic's values; also returns the value targets."""
    if batch.values is None:
        raise ValueError("advantage 'gae' needs critic values: pass values=[B, T]")
    return gae(batch.token_rewards, batch.values, batch.mask, cfg.gamma, cfg.lam)


def _grpo(cfg: AlgoConfig, batch: AdvantageBatch, scale: bool) -> Tensor:
    r = batch.seq_rewards  # [B]
    mean, std, _ = group_stats(r, batch.group_index, unbiased=cfg.std_unbiased)  # [B] each
    adv = r - mean  # [B]
    if scale:
        if cfg.std_scope == "batch":
            std = r.std(unbiased=cfg.std_unbiased) if r.numel() > 1 else torch.zeros_like(r)
        adv = adv / (std + cfg.adv_eps)
    return _broadcast(adv, batch.mask)


@register_advantage_estimator("grpo")
def grpo_estimator(cfg: AlgoConfig, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """GRPO: ``(r - group mean) / (group std + eps)`` (std scaling when ``std_normalize``)."""
    return _grpo(cfg, batch, scale=cfg.std_normalize), None


@register_advantage_estimator("dr_grpo")
def dr_grpo_estimator(cfg: AlgoConfig, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """Dr. GRPO: ``r - group mean``, never divided by the std."""
    return _grpo(cfg, batch, scale=False), None


@register_advantage_estimator("rloo")
def rloo_estimator(cfg: AlgoConfig, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """RLOO: ``r_i - mean_{j != i} r_j`` within the group (0 for a group of one)."""
    r = batch.seq_rewards  # [B]
    mean, _, size = group_stats(r, batch.group_index)  # [B] each
    adv = torch.where(size > 1, (r - mean) * size / (size - 1).clamp(min=1.0), torch.zeros_like(r))
    return _broadcast(adv, batch.mask), None


@register_advantage_estimator("reinforce")
def reinforce_estimator(cfg: AlgoConfig, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
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
def reinforce_pp_estimator(cfg: AlgoConfig, batch: AdvantageBatch) -> tuple[Tensor, Tensor | None]:
    """REINFORCE++: token returns (KL penalty folded in per token), whitened over the batch."""
    returns = discounted_returns(batch.token_rewards, batch.mask, cfg.gamma)  # [B, T]
    return masked_whiten(returns, batch.mask, eps=cfg.adv_eps), None
