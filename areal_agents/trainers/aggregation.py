"""Aggregation: the explicit step that turns a per-token loss ``[B, T]`` into a scalar.

:func:`aggregate` divides a masked sum by :func:`aggregation_normalizer`; a learner computes the
normalizer over a whole minibatch and passes it to every micro-batch, so that micro-batch losses
sum to the full-batch value under gradient accumulation. Every policy loss of
:mod:`areal_agents.trainers.losses` combines with every aggregation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.trainers.masked import masked_sum

__all__ = ["AGGREGATIONS", "aggregate", "aggregation_normalizer"]

#: The explicit ways of turning a per-token loss ``[B, T]`` into a scalar.
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_sum_norm")


def _unknown(mode: str) -> ConfigError:
    return ConfigError(
        f"algo.aggregation={mode!r} is unknown"
        + did_you_mean(mode, AGGREGATIONS)
        + f"; choose one of {list(AGGREGATIONS)}"
    )


def aggregation_normalizer(mask: Tensor, mode: str, *, norm_tokens: int | None = None) -> Tensor:
    """The denominator :func:`aggregate` divides by, over the rows of ``mask`` ``[B, T]``.

    ``token_mean``: the number of policy tokens; ``seq_mean_token_mean``: the number of rows
    with policy tokens; ``seq_sum_norm``: ``B * L`` with ``L = norm_tokens`` (Dr. GRPO's constant:
    the trainer always passes one, ``TrainConfig`` resolves it), else the most policy tokens any
    row holds (never the padded width ``T``: prompt and tool tokens do not count). A learner
    computes it over a whole minibatch and passes it to every micro-batch's :func:`aggregate`.
    Never below 1 for the counts.

    >>> m = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    >>> [float(aggregation_normalizer(m, a)) for a in AGGREGATIONS]
    [2.0, 1.0, 4.0]
    >>> float(aggregation_normalizer(m, "seq_sum_norm", norm_tokens=10))
    20.0
    """
    maskf = mask.float()
    if mode == "token_mean":
        return maskf.sum().clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        return (maskf.sum(1) > 0).float().sum().clamp(min=1.0)
    if mode == "seq_sum_norm":
        length = float(maskf.sum(1).max().clamp(min=1.0)) if norm_tokens is None else norm_tokens
        return torch.tensor(float(mask.shape[0] * length))
    raise _unknown(mode)


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
      None, the longest row's policy tokens (Dr. GRPO, TRL ``dr_grpo`` with
      ``L = max_completion_length``: a constant, which the trainer passes).

    The denominator is :func:`aggregation_normalizer` of ``mask``; ``normalizer`` replaces it
    with one computed over a larger batch, so that micro-batch losses *sum* to the full-batch
    value under gradient accumulation.

    >>> x = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0]])
    >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    >>> aggregate(x, m, "token_mean"), aggregate(x, m, "seq_mean_token_mean")
    (tensor(3.), tensor(3.5000))
    >>> aggregate(x, m, "seq_sum_norm", norm_tokens=4)
    tensor(1.1250)
    """
    if normalizer is None:
        normalizer = aggregation_normalizer(mask, mode, norm_tokens=norm_tokens).to(x.dtype)
    if mode == "seq_mean_token_mean":
        maskf = mask.to(x.dtype)
        per_row = masked_sum(x, mask, dim=1) / maskf.sum(1).clamp(min=1.0)  # [B]
        return (per_row * (maskf.sum(1) > 0).to(x.dtype)).sum() / normalizer
    if mode in AGGREGATIONS:
        return masked_sum(x, mask) / normalizer
    raise _unknown(mode)
