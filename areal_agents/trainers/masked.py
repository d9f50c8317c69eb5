"""Statistics over the policy tokens of right-padded ``[B, T]`` tensors.

``mask`` is 1 on the positions that count (policy tokens) and 0 elsewhere; what sits off the
mask may be anything, even inf or NaN, and never reaches a result. Every reduction of an empty
mask is 0, never NaN. The advantage estimators and the losses share these helpers and import
nothing from each other for them.

>>> masked_mean(torch.tensor([1.0, 2.0, 9.0]), torch.tensor([1, 1, 0]))
tensor(1.5000)
>>> masked_max(torch.tensor([1.0, float("nan")]), torch.tensor([1, 0]))
tensor(1.)
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is 1."""
    xm = torch.where(mask.bool(), x, torch.zeros_like(x))
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over ``mask == 1`` (0 where the mask is empty)."""
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
