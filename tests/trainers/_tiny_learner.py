"""A learner on the tiny model and batches whose ratios are known, for the tests of every key.

``row`` builds a trajectory whose behaviour log-probs are the tiny model's own plus ``offset``,
so that ``offset=-0.5`` makes ``pi / pi_behav = e^0.5`` on every policy token; ``step`` is the
metrics of one ``train_step`` of a fresh learner (one rank in this process, gloo), computed once
per distinct argument set.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from areal_agents.net import free_port
from areal_agents.trainers.algorithms import AlgoConfig
from areal_agents.trainers.batching import sequence_logprobs
from areal_agents.trainers.config import ModelConfig, TrainerConfig
from areal_agents.trainers.learner import Learner, LearnerSpec
from areal_agents.trainers.modeling import load_policy, tiny_model_path
from areal_agents.types import Trajectory

__all__ = [
    "MAX_TOKENS",
    "A",
    "algo",
    "batch",
    "fresh_batch",
    "grad_norm_left",
    "largest_change",
    "learner",
    "params",
    "process_group",
    "row",
    "step",
]


@pytest.fixture(scope="module", autouse=True)
def process_group() -> Iterator[None]:
    """One torch thread, and no process group left behind (a module importing this runs under
    it)."""
    import torch.distributed as dist

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: one thread is the fastest on a busy machine
    yield
    torch.set_num_threads(threads)
    if dist.is_initialized():
        dist.destroy_process_group()


MAX_TOKENS = 8  # the per-turn limit the learner is told (inference.max_tokens)


@functools.cache
def _port() -> int:
    return free_port()


@functools.cache
def _model() -> Any:
    return load_policy(tiny_model_path()).eval()


@functools.cache
def _own_logprobs(ids: tuple[int, ...]) -> tuple[float, ...]:
    """log p(ids[i] | ids[:i]) under the tiny model, 0.0 at position 0."""
    with torch.no_grad():
        x = torch.tensor([ids])
        lp = sequence_logprobs(_model()(input_ids=x).logits, x, 1.0)[0]
    return (0.0, *lp.tolist())


def row(
    group: str,
    reward: float,
    turns: tuple[int, ...] = (5, 3),
    *,
    offset: float = 0.0,
    truncated: bool = False,
    seed: int = 0,
    prefix: tuple[int, ...] = (),
) -> Trajectory:
    """``prefix``, 4 prompt tokens, then the turns' policy tokens with 2 tool tokens between
    them."""
    mask = [0] * 4
    for i, n in enumerate(turns):
        mask += ([0, 0] if i else []) + [1] * n
    rng = random.Random(f"{group}{reward}{turns}{seed}")
    ids = prefix + tuple(rng.randrange(5, 2000) for _ in mask)
    mask = [0] * len(prefix) + mask
    own = _own_logprobs(ids)
    return Trajectory(
        sequence_ids=ids,
        loss_mask=tuple(mask),
        behavior_logprobs=tuple(lp + offset if m else 0.0 for lp, m in zip(own, mask, strict=True)),
        versions=tuple(0 if m else -1 for m in mask),
        reward=reward,
        group_id=group,
        truncated=truncated,
    )


def batch(offset: float = 0.0, **kw: Any) -> list[Trajectory]:
    """Two groups of two, rewards 1 and 0 in each: GRPO advantages are +-0.7071."""
    return [row(g, r, offset=offset, **kw) for g in ("a", "b") for r in (1.0, 0.0)]


def fresh_batch(lrn: Learner, offset: float = 0.0) -> list[Trajectory]:
    """:func:`batch` with its behaviour log-probs taken from ``lrn``'s weights as they are now
    (plus ``offset``), as an on-policy batch after ``lrn``'s last update would carry them: a
    second step on :func:`batch`'s log-probs, which are the untrained model's, is off-policy by
    the first update, and PPO's clip zeroes most of its tokens."""
    out = []
    for t in batch():
        x = torch.tensor([t.sequence_ids])
        with torch.no_grad():
            lp = sequence_logprobs(lrn.model(input_ids=x).logits, x, 1.0)[0].tolist()
        own = (0.0, *lp)
        behav = tuple(v + offset if m else 0.0 for v, m in zip(own, t.loss_mask, strict=True))
        out.append(dataclasses.replace(t, behavior_logprobs=behav))
    return out


def learner(
    algo: AlgoConfig | str = "grpo",
    *,
    model: ModelConfig | None = None,
    replay: tuple[tuple[list[int], list[int]], ...] = (),
    **trainer: Any,
) -> Learner:
    """A set-up learner on the tiny model (``model``: its ``ModelConfig``, default
    ``name="tiny"``; ``replay``: its demonstration replay pool), ``trainer``: ``TrainerConfig``
    fields."""
    algo_cfg = AlgoConfig.from_name(algo) if isinstance(algo, str) else algo
    trainer_cfg = TrainerConfig(**{"lr": 1e-3, "groups_per_step": 2, **trainer})
    spec = LearnerSpec(
        model_dir=str(tiny_model_path()),
        algo=algo_cfg,
        trainer=trainer_cfg,
        model=model if model is not None else ModelConfig(name="tiny"),
        temperature=1.0,
        rank=0,
        world_size=1,
        max_response_tokens=MAX_TOKENS,
        replay=replay,
    )
    out = Learner(spec)
    out.setup("127.0.0.1", _port())
    return out


def algo(preset: str = "grpo", **changes: Any) -> AlgoConfig:
    return AlgoConfig.from_name(preset).replace(**changes)


def step(
    cfg: AlgoConfig | str = "grpo", data: list[Trajectory] | None = None, **trainer: Any
) -> dict[str, float]:
    """The metrics of one train_step of a fresh learner (deterministic, so computed once)."""
    return dict(_step(cfg, tuple(data if data is not None else batch()), tuple(trainer.items())))


@functools.cache
def _step(
    cfg: AlgoConfig | str, data: tuple[Trajectory, ...], trainer: tuple[tuple[str, Any], ...]
) -> dict[str, float]:
    return learner(cfg, **dict(trainer)).train_step(list(data))


def params(lrn: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lrn.full_state().items()}


def largest_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    return max(float((after[k] - before[k]).abs().max()) for k in before)


def grad_norm_left(lrn: Learner) -> float:
    """The norm of the gradients the last update used (after clipping)."""
    grads = [p.grad for p in lrn.model.parameters() if p.grad is not None]
    return float(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    )


A = 1 / math.sqrt(2)  # GRPO's advantage for rewards (1, 0) in a group: 0.5 / std(1, 0)
