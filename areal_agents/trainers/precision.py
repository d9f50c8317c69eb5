"""Mixed precision for the learner: compute in bfloat16, keep the weights in float32.

``model.compute_dtype=bfloat16`` runs the policy's (and the reference's and critic's) matrix
products in bfloat16 under ``torch.autocast`` while the parameters, their gradients and the
AdamW moments stay in ``model.dtype`` (float32 by default): the layout FSDP's
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` gives on GPUs, done here
with autocast so that it works the same on one CPU rank, under gradient checkpointing (which
restores the autocast state when it recomputes) and with LoRA.

The output projection stays in full precision: :func:`mixed_precision` turns autocast off
inside the model's output head and upcasts its input, so the logits, and so the log-probs,
the importance ratios and the entropies, are computed in float32 from bfloat16 hidden states.
A bfloat16 logit carries 8 bits of mantissa (at a magnitude of 20 it is off by up to 0.06).
Measured on SmolLM2-135M and random tokens, the mean change of a token's log-prob against
float32 is 0.033 with the float32 head and 0.051 with a bfloat16 one.

Why: on CPUs with bf16 matrix units (AMX, AVX512-BF16) it is where the learner's time goes.
Measured on SmolLM2-135M, a forward and backward over 4 x 512 tokens
(``benchmarks/learner_precision.py``): 14 s in float32 and 6 s under bf16 autocast on 2
threads; 25 s and 9-12 s on one.
Without such units bf16 arithmetic is emulated and slower than float32: keep the default there.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

__all__ = ["COMPUTE_DTYPES", "mixed_precision"]

COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16")


def _head(model: nn.Module) -> nn.Module | None:
    """The module whose output is the model's final scores: an HF causal LM's output
    embeddings, or a value model's ``head``."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        head = getattr(model, "head", None)
    return head if isinstance(head, nn.Module) else None


def mixed_precision(model: nn.Module, compute_dtype: str, device_type: str) -> nn.Module:
    """Make every forward of ``model`` compute in ``compute_dtype`` (autocast on
    ``device_type``), its output head in float32; returns ``model`` (changed in place).

    ``float32`` leaves it as it is. Call it before sharding: it wraps the instance's
    ``forward`` (FSDP's hooks run around it) and its head's. Parameters are not cast.
    """
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype={compute_dtype!r}: choose one of {COMPUTE_DTYPES}")
    if compute_dtype == "float32":
        return model
    dtype = getattr(torch, compute_dtype)
    body = model.forward

    @functools.wraps(body)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return body(*args, **kwargs)

    model.forward = forward
    head = _head(model)
    if head is not None:
        scores = head.forward

        @functools.wraps(scores)
        def full_precision(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type, enabled=False):
                weight = getattr(head, "weight", None)
                target = weight.dtype if isinstance(weight, torch.Tensor) else torch.float32
                return scores(x.to(target), *args, **kwargs)

        head.forward = full_precision
    return model
