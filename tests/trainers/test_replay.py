"""Demonstration replay during RL (``algo.replay_coef``, ``algo.replay_demos``;
``trainers/replay.py``): every update adds the warm start's supervised loss on the next
demonstrations of a pool, on the tiny model through :meth:`Learner.train_step`."""

from __future__ import annotations

import random

import pytest
import torch

from areal_agents.config import load_config
from areal_agents.errors import ConfigError
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.held_out import held_out_task_ids
from areal_agents.trainers.modeling import tiny_model_path
from areal_agents.trainers.replay import replay_chunk, replay_rows
from areal_agents.trainers.warm_start import demonstrations
from tests.trainers._tiny_learner import (
    algo,
    batch,
    largest_change,
    learner,
    params,
    process_group,  # noqa: F401  (the autouse fixture)
)

CODE = ["env=code_sandbox", "env.kwargs={sandbox_backend: process}", "eval.held_out_tasks=8"]


def _pool(n: int, length: int = 12) -> tuple[tuple[list[int], list[int]], ...]:
    """``n`` demonstrations: 4 prompt tokens, then ``length - 4`` trained ones."""
    rng = random.Random(n)
    return tuple(
        ([rng.randrange(5, 2000) for _ in range(length)], [0] * 4 + [1] * (length - 4))
        for _ in range(n)
    )


def _nll(lrn: object, rows: list[tuple[list[int], list[int]]]) -> float:
    """The mean negative log-likelihood of ``rows``' trained tokens under ``lrn``'s model."""
    total, count = 0.0, 0
    model = lrn.model  # type: ignore[attr-defined]
    with torch.no_grad():
        for ids, mask in rows:
            x = torch.tensor([ids])
            lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
            picked = lp.gather(-1, x[0, 1:, None])[:, 0]
            where = torch.tensor(mask[1:], dtype=torch.bool)
            total -= float(picked[where].sum())
            count += int(where.sum())
    return total / count


def test_replay_adds_the_demonstrations_loss_to_every_update() -> None:
    pool = _pool(8)
    plain = learner(replay=pool)
    off = plain.train_step(batch())
    assert "replay/nll" not in off  # replay_coef=0 (the default): off
    lrn = learner(algo(replay_coef=1.0), replay=pool)
    first, second = replay_chunk(pool, 0, 4), replay_chunk(pool, 1, 4)
    assert first == list(pool[:4]) and second == list(pool[4:])
    expected = _nll(lrn, first)
    m = lrn.train_step(batch())
    assert m["replay/nll"] == pytest.approx(expected, rel=1e-4)  # the pool's first 4 rows
    assert m["grad_norm"] > off["grad_norm"] * 1.01  # the replay's gradient joined the update
    expected = _nll(lrn, second)  # the next update takes the next 4, under the moved model
    assert lrn.train_step(batch())["replay/nll"] == pytest.approx(expected, rel=1e-4)


def test_replay_alone_is_supervised_fine_tuning_on_the_pool() -> None:
    """Both advantage scales at 0 are refused without replay; with it, the run is the replay
    alone (the supervised control): no episode trains, and the pool's loss falls."""
    with pytest.raises(ConfigError, match="both 0"):
        algo(positive_scale=0.0, negative_scale=0.0)
    pool = _pool(4)
    lrn = learner(algo(positive_scale=0.0, negative_scale=0.0, replay_coef=1.0), replay=pool)
    before, nll = params(lrn), _nll(lrn, list(pool))
    for _ in range(3):
        m = lrn.train_step(batch())
        assert m["learner/rows_trained"] == 0
    assert largest_change(before, params(lrn)) > 0
    assert _nll(lrn, list(pool)) < nll - 0.1
    double = learner(algo(positive_scale=0.0, negative_scale=0.0, replay_coef=2.0), replay=pool)
    single = learner(algo(positive_scale=0.0, negative_scale=0.0, replay_coef=1.0), replay=pool)
    g2, g1 = double.train_step(batch())["grad_norm"], single.train_step(batch())["grad_norm"]
    assert g2 == pytest.approx(2 * g1, rel=1e-4)  # replay_coef scales the gradient


def test_replay_demos_sizes_the_pool_of_non_held_out_demonstrations() -> None:
    from transformers import AutoTokenizer

    cfg = load_config(TrainConfig, [*CODE, "algo.replay_coef=0.5", "algo.replay_demos=6"])
    held_out = held_out_task_ids(cfg)
    rows = replay_rows(cfg, tiny_model_path(), held_out)
    assert len(rows) == 6
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    trained = {
        tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]) for ids, mask in rows
    }
    answers = {str(m[-1]["content"]) for m, _ in demonstrations(cfg, 6, held_out)}
    assert {t.removesuffix("<|im_end|>") for t in trained} == answers  # the warm start's own
    bigger = load_config(TrainConfig, [*CODE, "algo.replay_coef=0.5", "algo.replay_demos=9"])
    assert len(replay_rows(bigger, tiny_model_path(), held_out)) == 9
    with pytest.raises(ConfigError, match="no demonstration"):
        replay_rows(
            load_config(TrainConfig, ["env=calculator", "algo.replay_coef=1"]),
            tiny_model_path(),
            None,
        )
    for bad in ("algo.replay_coef=-1", "algo.replay_demos=0"):
        with pytest.raises(ConfigError, match="replay"):
            load_config(TrainConfig, [bad])
