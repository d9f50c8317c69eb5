"""Demonstration replay during RL: the warm start's supervised loss kept as an anchor.

InstructGPT's PPO-ptx adds the pre-training loss to every PPO update so that RL does not unlearn
what pre-training taught. Here the anchor is the warm start's own data: with
``algo.replay_coef > 0`` every update adds ``replay_coef`` times the mean negative log-likelihood
of ``warm_start.batch_size`` demonstrations (the assistant tokens only, as the warm start
trains them), taken in turn from a pool of ``algo.replay_demos`` (the warm start's first ones:
the same environment seeds, the same held-out exclusions). A KL to the warm-started model pulls
back on the very tokens RL samples; replay pulls towards right answers only, which real rewards
push towards too, and a reward with no signal does not.

The pool is encoded once, on the driver (:func:`replay_rows`), and travels in the learners'
spec; every rank forwards the whole chunk of a step (FSDP averages the ranks' gradients, so
the update is the single-rank one) and :func:`replay_backward` adds its gradient.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_agents.errors import ConfigError
from areal_agents.trainers.config import TrainConfig

__all__ = ["ReplayRow", "replay_backward", "replay_chunk", "replay_rows"]

ReplayRow = tuple[list[int], list[int]]
"""A demonstration's token ids and its 0/1 mask over the assistant tokens."""


def replay_rows(
    cfg: TrainConfig, model_dir: Path, exclude: frozenset[str] | None
) -> list[ReplayRow]:
    """The replay pool: ``algo.replay_demos`` demonstrations of the environment (none whose task
    id is in ``exclude``: the held-out tasks), encoded with the tokenizer and chat template in
    ``model_dir`` and shuffled by ``trainer.seed``. A clear error where there are none."""
    from transformers import AutoTokenizer

    from areal_agents.trainers.warm_start import demonstrations, encode_demonstration

    demos = demonstrations(cfg, cfg.algo.replay_demos, exclude)
    if not demos:
        raise ConfigError(
            f"algo.replay_coef={cfg.algo.replay_coef}: env={cfg.env.name}'s tasks carry no "
            "demonstration to replay (set algo.replay_coef=0)"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rows = [encode_demonstration(tokenizer, m, t) for m, t in demos]
    random.Random(cfg.trainer.seed).shuffle(rows)
    return rows


def replay_chunk(rows: Sequence[ReplayRow], step: int, size: int) -> list[ReplayRow]:
    """The ``size`` rows of update ``step``, taken in turn from ``rows`` (cycling).

    >>> replay_chunk([([1], [0]), ([2], [0]), ([3], [0])], 1, 2)
    [([3], [0]), ([1], [0])]
    """
    if not rows:
        return []
    return [rows[(step * size + i) % len(rows)] for i in range(min(size, len(rows)))]


def replay_backward(model: Any, rows: Sequence[ReplayRow], coef: float, device: Any) -> float:
    """Add the gradient of ``coef`` times the mean negative log-likelihood of ``rows``'
    assistant tokens to ``model``'s (the warm start's own loss,
    :func:`~areal_agents.trainers.warm_start.demonstration_backward`); returns that mean, the
    loss before ``coef``."""
    from areal_agents.trainers.warm_start import demonstration_backward, trained_tokens

    targets = trained_tokens(rows)
    if not targets:
        return 0.0
    return demonstration_backward(model, rows, coef / targets, device) / targets
