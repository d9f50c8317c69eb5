"""Off-policy corrections: the behaviour importance weight ``pi_prox / pi_behav`` and what is done
with it above a cap, per token, per turn or per sequence.

In async training a token was sampled by the behaviour policy ``pi_behav`` (weights up to
``max_staleness`` versions old); the loss takes its trust region around the proximal policy
``pi_prox`` (the step-start weights) and reweights each token by ``w = pi_prox / pi_behav``
(:func:`~areal_agents.trainers.losses.decoupled_ppo_loss`). Tail tokens sampled at temperature 1
can carry weights in the thousands; the knobs of :func:`behavior_weights` say what happens to
them (``algo.behavior_imp_*``):

* ``level`` — the unit the weight is taken over. ``token``: each token's own ``w_t``;
  ``turn``: one weight for every token of an assistant turn (a run of policy tokens);
  ``sequence``: one weight for every policy token of the episode, so that a later turn's tokens
  carry the weight of the context the old policy wrote before them.
* ``agg`` (turn and sequence) — ``geometric``: ``exp(mean_t log w_t)`` (length-neutral, as
  GSPO and geometric-mean masking use it); ``product``: ``exp(sum_t log w_t)`` (the textbook
  sequence importance ratio, exact and high-variance).
* ``mode`` — above ``cap`` (or below ``floor``): ``truncate`` keeps the unit at weight
  ``min(w, cap)`` (truncated importance sampling, TIS); ``mask`` drops it (weight 0: AReaL's
  token masking at ``level=token``, masked importance sampling MIS at turn/sequence level).
  ``floor`` (None: none) masks units whose weight is below it, in either mode.

So ``token + truncate`` is TIS, ``token + mask`` is AReaL's behaviour cap, ``sequence +
mask + geometric`` is geometric-mean sequence masking. No gradient flows through a weight.

Metrics (token means over the mask, except ``*_seqs``, a count): ``behavior/kl`` (the KL from the
behaviour policy to the proximal one, estimated on the behaviour's own samples: k3 with
``r = pi_prox / pi_behav``, i.e. ``r - 1 - log r``), ``behavior/weight/{mean,min,max}`` (the
token weights before any correction), ``behavior/capped_frac`` (tokens the correction acted
on), ``behavior/truncated_frac``, ``behavior/masked_frac`` and ``behavior/masked_seqs``
(the number of sequences with at least one masked token; the learner sums it over the batch).

>>> import torch
>>> prox = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
>>> behav = torch.log(torch.tensor([[0.05, 0.5, 0.25]]))   # token weights 10, 1, 2
>>> mask = torch.ones(1, 3)
>>> w, _ = behavior_weights(prox, behav, mask, cap=5.0, mode="truncate")
>>> [round(x, 3) for x in w[0].tolist()]
[5.0, 1.0, 2.0]
>>> w, m = behavior_weights(prox, behav, mask, cap=5.0, mode="mask")
>>> [round(x, 3) for x in w[0].tolist()], round(float(m["behavior/masked_frac"]), 3)
([0.0, 1.0, 2.0], 0.333)
>>> w, _ = behavior_weights(prox, behav, mask, cap=5.0, mode="mask", level="sequence")
>>> [round(x, 3) for x in w[0].tolist()]   # geometric mean of 10, 1, 2 = 20 ** (1/3)
[2.714, 2.714, 2.714]
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_agents.trainers.masked import masked_max, masked_mean, masked_min

__all__ = [
    "IMP_AGGS",
    "IMP_LEVELS",
    "IMP_MODES",
    "behavior_kl",
    "behavior_weights",
    "segment_ids",
    "unit_log_ratio",
    "weight_summary",
]

#: What the behaviour weight is taken over (see the module docstring).
IMP_LEVELS = ("token", "turn", "sequence")
#: How a turn's or sequence's token log-ratios combine.
IMP_AGGS = ("geometric", "product")
#: What happens to a unit whose weight is above the cap.
IMP_MODES = ("truncate", "mask")

_LIMIT = 20.0  # log-weights are clamped to +-20 before exp: no inf, no NaN


def segment_ids(mask: Tensor) -> Tensor:
    """Per position, the index of the assistant turn it belongs to within its row: turns are the
    runs of 1s of ``mask`` ``[B, T]`` (tool and user tokens between them are 0). Positions off
    the mask get the index of the turn before them (they are never read).

    >>> segment_ids(torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1]])).tolist()
    [[-1, 0, 0, 0, 0, 1, 1, 2]]
    """
    on = mask > 0
    start = on & ~torch.nn.functional.pad(on, (1, 0))[:, :-1]  # [B, T]: a turn's first token
    return start.long().cumsum(dim=1) - 1


def unit_log_ratio(log_ratio: Tensor, mask: Tensor, level: str, agg: str = "geometric") -> Tensor:
    """Each token's log-weight at ``level`` ``[B, T]``: its own (``token``), or the sum
    (``product``) or mean (``geometric``) of the log-ratios of its turn or its whole sequence,
    repeated on every token of that unit. Off-mask positions are 0."""
    maskf = mask.to(log_ratio.dtype)
    lr = log_ratio * maskf
    if level == "token":
        return lr
    if level == "sequence":
        total = lr.sum(dim=1, keepdim=True)  # [B, 1]
        count = maskf.sum(dim=1, keepdim=True).clamp(min=1.0)
        unit = total / count if agg == "geometric" else total
        return unit.expand_as(lr) * maskf
    if level == "turn":
        seg = segment_ids(mask).clamp(min=0)  # [B, T]
        turns = int(seg.max()) + 1 if seg.numel() else 1
        total = torch.zeros(lr.shape[0], turns, dtype=lr.dtype, device=lr.device)
        count = torch.zeros_like(total)
        total.scatter_add_(1, seg, lr)
        count.scatter_add_(1, seg, maskf)
        unit = total / count.clamp(min=1.0) if agg == "geometric" else total
        return unit.gather(1, seg) * maskf
    raise ValueError(f"level={level!r}: choose one of {IMP_LEVELS}")


def behavior_kl(proximal_logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor) -> Tensor:
    """KL(pi_behav || pi_prox) per token on tokens sampled by the behaviour policy: the k3
    estimator ``r - 1 - log r`` with ``r = pi_prox / pi_behav`` (unbiased, never negative).
    Token mean over ``mask``."""
    log_r = (proximal_logprobs - behavior_logprobs).clamp(-_LIMIT, _LIMIT)
    return masked_mean(torch.expm1(log_r) - log_r, mask)


def behavior_weights(
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    mask: Tensor,
    cap: float | None,
    mode: str,
    *,
    level: str = "token",
    agg: str = "geometric",
    floor: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The corrected importance weight of every token ``[B, T]`` (detached) and its metrics;
    see the module docstring for ``cap``, ``mode``, ``level``, ``agg`` and ``floor``."""
    prox, behav = proximal_logprobs.detach(), behavior_logprobs.detach()
    log_w = (prox - behav).clamp(-_LIMIT, _LIMIT)  # [B, T] token log-weights
    token_w = torch.exp(log_w)
    unit_w = torch.exp(unit_log_ratio(log_w, mask, level, agg).clamp(-_LIMIT, _LIMIT))
    on = mask > 0
    above = torch.zeros_like(on) if cap is None else on & (unit_w > cap)
    below = torch.zeros_like(on) if floor is None else on & (unit_w < floor)
    if mode == "truncate":
        truncated, masked = above, below
    elif mode == "mask":
        truncated, masked = torch.zeros_like(on), above | below
    else:
        raise ValueError(f"mode={mode!r}: choose one of {IMP_MODES}")
    w = unit_w if cap is None else torch.where(truncated, torch.full_like(unit_w, cap), unit_w)
    w = torch.where(masked, torch.zeros_like(w), w)
    rows = on.any(dim=1)
    metrics = {
        "behavior/weight/mean": masked_mean(token_w, mask),
        "behavior/weight/min": masked_min(token_w, mask),
        "behavior/weight/max": masked_max(token_w, mask),
        "behavior/kl": behavior_kl(prox, behav, mask),
        "behavior/capped_frac": masked_mean((truncated | masked).to(w.dtype), mask),
        "behavior/truncated_frac": masked_mean(truncated.to(w.dtype), mask),
        "behavior/masked_frac": masked_mean(masked.to(w.dtype), mask),
        "behavior/masked_seqs": (masked.any(dim=1) & rows).to(w.dtype).sum(),
    }
    return w, metrics


def weight_summary(log_weights: Tensor) -> dict[str, float]:
    """The batch's token importance weights ``pi_start / pi_behav`` (given as log-weights of its
    policy tokens, ``[N]``, the step-start policy against the sampler): their mean, quantiles
    and extremes ``behavior/weight/{mean,min,q50,q90,q99,max}`` and ``behavior/kl`` (k3,
    :func:`behavior_kl`), over every policy token of the batch whatever the loss (``{}`` for
    none).

    >>> s = weight_summary(torch.log(torch.tensor([1.0, 1.0, 2.0, 4.0])))
    >>> [round(s[k], 4) for k in ("behavior/weight/q50", "behavior/weight/max", "behavior/kl")]
    [1.5, 4.0, 0.4801]
    """
    if log_weights.numel() == 0:
        return {}
    lw = log_weights.double().clamp(-_LIMIT, _LIMIT)
    w = torch.exp(lw)
    q = torch.quantile(w, torch.tensor([0.5, 0.9, 0.99], dtype=w.dtype))
    return {
        "behavior/weight/mean": float(w.mean()),
        "behavior/weight/min": float(w.min()),
        "behavior/weight/q50": float(q[0]),
        "behavior/weight/q90": float(q[1]),
        "behavior/weight/q99": float(q[2]),
        "behavior/weight/max": float(w.max()),
        "behavior/kl": float((torch.expm1(lw) - lw).mean()),
    }
