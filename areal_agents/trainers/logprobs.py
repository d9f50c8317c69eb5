"""Token log-probabilities and entropies from logits, on TRL's memory-efficient kernels.

Thin wrappers over ``trl.trainer.utils`` (``selective_log_softmax``, ``entropy_from_logits``,
``selective_log_softmax_and_entropy``): they gather row by row instead of materialising a full
``log_softmax`` over the vocabulary, and use TRL's fused Triton kernel where it applies. What
the wrappers add is the one alignment the rest of the trainer uses
(:func:`next_token_logprobs`): a ``[B, T]`` tensor whose position ``t`` is the log-probability
of ``input_ids[:, t]`` given the tokens before it, so that it lines up with the trajectory's
``loss_mask`` and ``behavior_logprobs`` token for token (position 0 has no prediction: 0).

TRL is imported on first use (it takes a few seconds), so importing this module is cheap.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
from torch import Tensor

from areal_agents.errors import DependencyError

__all__ = [
    "entropy_from_logits",
    "gather_logprobs",
    "logprobs_and_entropy",
    "next_token_logprobs",
]


@functools.cache
def _trl_utils() -> ModuleType:
    try:
        import trl.trainer.utils as utils
    except ImportError as e:  # pragma: no cover - trl is part of the train extra
        raise DependencyError.missing("trl", "train") from e
    return utils


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (the sampling temperature)")


def gather_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` at ``tokens``: ``[..., V]`` x ``[...]`` -> ``[...]``.

    Divide by the temperature the tokens were *sampled* with, so that the learner's log-probs
    match the inference server's.
    """
    _check_temperature(temperature)
    return _trl_utils().selective_log_softmax(logits, tokens, temperature=temperature)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, chunk_size: int = 128) -> Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)``: ``[..., V]`` -> ``[...]``."""
    _check_temperature(temperature)
    if temperature != 1.0:
        logits = logits / temperature
    return _trl_utils().entropy_from_logits(logits, chunk_size=chunk_size)


def logprobs_and_entropy(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0, entropy_grad: bool = True
) -> tuple[Tensor, Tensor]:
    """Both of the above in one pass over the logits; ``entropy_grad=False`` detaches it."""
    _check_temperature(temperature)
    return _trl_utils().selective_log_softmax_and_entropy(
        logits, tokens, entropy_requires_grad=entropy_grad, temperature=temperature
    )


def next_token_logprobs(
    logits: Tensor, input_ids: Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Causal-LM logits ``[B, T, V]`` and ids ``[B, T]`` -> log-probs (and entropies) ``[B, T]``.

    ``logits[:, t]`` predicts ``input_ids[:, t + 1]``; the result is shifted back so that
    position ``t`` holds ``log p(input_ids[:, t] | input_ids[:, :t])``, aligned with the ids and
    the loss mask. Position 0 (nothing predicts it) is 0. The entropy at ``t`` is that of the
    distribution ``input_ids[:, t]`` was drawn from.
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"logits {tuple(logits.shape)} and input_ids {tuple(input_ids.shape)}: "
            "expected [B, T, V] and [B, T]"
        )
    pred, target = logits[:, :-1], input_ids[:, 1:]  # [B, T-1, V], [B, T-1]
    entropy: Tensor | None = None
    if with_entropy:
        lp, ent = logprobs_and_entropy(pred, target, temperature)
        entropy = torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)  # [B, T]
    else:
        lp = gather_logprobs(pred, target, temperature)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1), entropy  # [B, T]
