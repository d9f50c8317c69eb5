"""Rows whose loss is zero everywhere (a GRPO group of equal rewards) are not forwarded: the
update is exactly the one that forwards them, in fewer passes."""

from __future__ import annotations

import pytest
import torch

from areal_agents.types import Trajectory
from tests.trainers._tiny_learner import (
    algo,
    learner,
    params,
    process_group,  # noqa: F401  (the autouse fixture)
    row,
)


def _rows() -> list[Trajectory]:
    # group a: rewards 1 and 0 (advantages +-0.71); group b: both 1 (advantages 0)
    return [row("a", 1.0), row("a", 0.0), row("b", 1.0, seed=1), row("b", 1.0, seed=2)]


def test_uniform_groups_are_skipped_and_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    skipping, full = learner(micro_batch_tokens=16), learner(micro_batch_tokens=16)
    calls: list[int] = []
    skipping.model.register_forward_hook(lambda *a: calls.append(1))
    monkeypatch.setattr(full, "_live_rows", lambda adv, mask: set(range(adv.shape[0])))
    m_skip, m_full = skipping.train_step(_rows()), full.train_step(_rows())
    assert m_skip["learner/rows_skipped"] == 2 and m_skip["learner/rows_trained"] == 2
    assert m_full["learner/rows_skipped"] == 0
    assert m_skip["loss/policy"] == pytest.approx(m_full["loss/policy"], abs=1e-7)
    a, b = params(skipping), params(full)
    assert all(torch.allclose(a[k], b[k], atol=1e-7) for k in a)
    probe_passes = 2  # the probe's rows before and after the step (one each)
    assert len(calls) == 2 + probe_passes * len(skipping.probe.rows or [])  # 2 rows, 1 each


def test_every_row_is_forwarded_when_another_term_reads_it() -> None:
    for cfg in (algo(kl_coef=0.1), algo(entropy_coef=0.01)):
        metrics = learner(cfg).train_step(_rows())
        assert metrics["learner/rows_skipped"] == 0, cfg


def test_a_step_with_nothing_to_train_leaves_the_weights_where_they_were() -> None:
    """After a real step Adam has momentum; a step whose groups all have equal rewards has no
    gradient, and taking it would move every weight by that momentum (by ~0.9 of the last
    step) with no data behind it: it is not taken."""
    lrn = learner()
    first = lrn.train_step(_rows())
    assert first["learner/updates_skipped_frac"] == 0.0
    before = params(lrn)
    uniform = [row(g, 1.0, seed=s) for g in ("a", "b") for s in (1, 2)]  # advantages all 0
    metrics = lrn.train_step(uniform)
    assert metrics["learner/rows_trained"] == 0 and metrics["grad_norm"] == 0.0
    assert metrics["learner/updates_skipped_frac"] == 1.0
    after = params(lrn)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert metrics["policy/update_kl"] == pytest.approx(0.0, abs=1e-9)


def test_a_first_step_with_nothing_to_train_still_advances_the_schedule() -> None:
    """A run whose first batch has no reward spread takes no optimizer step; the lr schedule
    still counts the step (the warm-up is in steps), and PyTorch's warning that the scheduler
    stepped before the optimizer, which reads like a bug in the user's run, is not raised."""
    import warnings

    lrn = learner()
    uniform = [row(g, 1.0, seed=s) for g in ("a", "b") for s in (1, 2)]  # advantages all 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = lrn.train_step(uniform)
    assert metrics["learner/updates_skipped_frac"] == 1.0
    assert lrn.scheduler.last_epoch == 1  # the schedule moved on by the step
