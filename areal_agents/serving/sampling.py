"""Choosing the next token of a row, the top log-probabilities reported with it, and whether
the row is done.

Sampling runs per row with the row's own temperature, top-p and random generator (so a seeded
request gives the same tokens whatever else is in the batch). Log-probabilities are those of the
raw model distribution, before temperature and top-p, as vLLM reports them by default
(``raw_logprobs``), or, with the server's ``--logprobs-mode processed_logprobs`` (vLLM's flag of
the same name), those of the distribution the token was drawn from (:func:`sampling_logprobs`):
what an RL learner's behaviour log-probs must be when it samples at a temperature other than 1.

>>> import torch
>>> logits = torch.tensor([0.0, 3.0, 1.0])
>>> pick(logits, 0.0, 1.0, torch.Generator())  # greedy
1
>>> pick(logits, 1.0, 0.5, torch.Generator().manual_seed(0))  # top-p keeps only token 1
1
>>> top_logprobs(torch.log_softmax(logits, -1), 2)[0][0]
1
"""

from __future__ import annotations

import math
from typing import Any

import torch

from areal_agents.serving.batch import Row

__all__ = ["check_done", "draw", "pick", "sampling_logprobs", "top_logprobs"]


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probabilities (``[vocab]``, float64) of the distribution :func:`pick` draws from at
    ``temperature`` > 0: the tempered softmax, cut to the smallest set of tokens whose
    probability reaches ``top_p`` and renormalised (``-inf`` outside it).

    >>> lp = sampling_logprobs(torch.log(torch.tensor([0.5, 0.3, 0.2])), 0.5, 1.0)
    >>> [round(float(x), 3) for x in lp.exp()]   # p^2, renormalised
    [0.658, 0.237, 0.105]
    >>> [round(float(x), 3) for x in sampling_logprobs(torch.zeros(3), 1.0, 0.5).exp()]
    [0.5, 0.5, 0.0]
    """
    logprobs = torch.log_softmax(logits.double().cpu() / temperature, dim=-1)
    if top_p >= 1.0:
        return logprobs
    sorted_lp, order = logprobs.sort(descending=True)
    sorted_p = sorted_lp.exp()
    drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # keep the smallest set reaching top_p
    sorted_lp = sorted_lp.masked_fill(drop, -math.inf)
    sorted_lp = sorted_lp - torch.logsumexp(sorted_lp, dim=-1)
    return torch.empty_like(logprobs).scatter_(0, order, sorted_lp)


def pick(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """One token from ``logits`` (``[vocab]``): the argmax at temperature 0, else a draw from
    the tempered distribution cut to the smallest set of tokens whose probability reaches
    ``top_p`` (:func:`sampling_logprobs`)."""
    if temperature <= 0.0:
        return int(logits.argmax())
    return draw(sampling_logprobs(logits, temperature, top_p), gen)


def draw(logprobs: torch.Tensor, gen: torch.Generator) -> int:
    """One token from the distribution ``logprobs`` (``[vocab]``, :func:`sampling_logprobs`)."""
    return int(torch.multinomial(logprobs.exp(), 1, generator=gen))


def top_logprobs(logprobs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of ``logprobs`` (``[vocab]``) as ``(token, logprob)``."""
    if k <= 0:
        return []
    values, indices = logprobs.topk(k)
    return list(zip(indices.tolist(), values.tolist(), strict=True))


def check_done(row: Row, token: int, eos_token_ids: frozenset[int], tokenizer: Any) -> None:
    """Set ``row.finish`` (and ``row.stop_reason``) when ``token``, just appended to
    ``row.tokens``, ends the generation: an end-of-sequence token (unless ``ignore_eos``), a stop
    token, a stop string in the decoded tail, or ``max_tokens`` reached."""
    req = row.request
    if token in eos_token_ids and not req.ignore_eos:
        row.finish = "stop"
    elif token in req.stop_token_ids:
        row.finish, row.stop_reason = "stop", token
    elif req.stop:
        tail = tokenizer.decode(row.tokens[-16:], skip_special_tokens=False)
        for s in req.stop:
            if s in tail:
                row.finish, row.stop_reason = "stop", s
                break
    if row.finish is None and len(row.tokens) >= req.max_tokens:
        row.finish = "length"
