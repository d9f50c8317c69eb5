"""A step's least and most values (``ratio/min``, ``ratio/max``) are over all of its tokens,
whatever the micro-batches, and a step with nothing to train measures no token mean at all."""

from __future__ import annotations

import math

import pytest

from areal_agents.types import Trajectory
from tests.trainers._tiny_learner import (
    algo,
    process_group,  # noqa: F401  (the autouse fixture)
    row,
    step,
)


def _two_ratios() -> list[Trajectory]:
    # group a is sampled e^0.5 less likely than the policy now makes it, group b e^0.5 more
    return [row(g, r, offset=off) for g, off in (("a", -0.5), ("b", 0.5)) for r in (1.0, 0.0)]


@pytest.mark.parametrize("micro_batch_tokens", [16, 4096])  # one row each / all in one
def test_ratio_extremes_are_over_the_whole_step(micro_batch_tokens: int) -> None:
    out = step(algo(loss="ppo_clip"), _two_ratios(), micro_batch_tokens=micro_batch_tokens)
    assert out["ratio/min"] == pytest.approx(math.exp(-0.5), rel=1e-3)
    assert out["ratio/max"] == pytest.approx(math.exp(0.5), rel=1e-3)
    assert out["ratio/mean"] == pytest.approx(math.cosh(0.5), rel=1e-3)  # equal token counts


def test_a_step_with_nothing_to_train_logs_no_token_mean() -> None:
    uniform = [row(g, 1.0, seed=s) for g in ("a", "b") for s in (1, 2)]  # advantages all 0
    out = step(algo(), uniform)
    assert out["learner/rows_trained"] == 0 and out["learner/rows_skipped"] == 4
    means = ("ratio/", "clip/", "entropy", "behavior/weight", "behavior/kl", "advantage/mean")
    measured = [k for k in out if k.startswith(means)]
    assert measured == [], measured  # absent, not 0: no token was measured
    assert out["behavior/masked_seqs"] == 0  # a count stays: no sequence was masked
    assert out["grad_norm"] == 0.0
