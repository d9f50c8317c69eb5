"""benchmarks/decoupled_vs_naive.py: the controlled staleness experiment behaves as derived."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import decoupled_vs_naive as dvn


def test_expected_reward_is_the_mean_probability_of_the_targets() -> None:
    theta = torch.zeros(2, 3, 4)  # uniform over 4 tokens
    assert dvn.expected_reward(theta, torch.zeros(2, 3, dtype=torch.long)) == pytest.approx(0.25)
    theta[0, :, 1] = 100.0  # context 0 always picks token 1, its target
    target = torch.tensor([[1, 1, 1], [0, 0, 0]])
    assert dvn.expected_reward(theta, target) == pytest.approx((1.0 + 0.25) / 2)


def test_fresh_data_gives_both_losses_the_same_run_and_stale_data_separates_them() -> None:
    kw = dict(steps=12, contexts=4, length=4, vocab=4, tasks_per_step=4, group_size=4)
    fresh = [dvn.train(loss, 0, seed=0, **kw) for loss in dvn.LOSSES]
    assert fresh[0]["curve"] == fresh[1]["curve"]  # staleness 0: sampler = proximal policy
    assert fresh[0]["curve"][-1] > fresh[0]["curve"][0]  # and it learns
    naive, decoupled = (dvn.train(loss, 8, seed=0, **kw) for loss in dvn.LOSSES)
    assert naive["curve"] != decoupled["curve"]
    assert naive["clip_frac_mean"] > 0.0 and decoupled["clip_frac_mean"] == 0.0


def test_each_correction_variant_runs_its_own_settings() -> None:
    kw = dict(steps=12, contexts=4, length=4, vocab=4, tasks_per_step=4, group_size=4, updates=4)
    runs = {v: dvn.train(v, 8, seed=0, lr=1.0, **kw) for v in dvn.VARIANTS}
    assert runs["decoupled_ppo+mask"]["capped_frac_mean"] > 0  # the cap binds here
    assert runs["decoupled_ppo+no_cap"]["capped_frac_mean"] == 0.0
    assert runs["decoupled_ppo"]["curve"] == runs["decoupled_ppo+mask"]["curve"]  # the default
    # one weight per sequence (geometric mean) is another update than one per token
    assert runs["decoupled_ppo+seq_geo_mask"]["curve"] != runs["decoupled_ppo+mask"]["curve"]
    with pytest.raises(SystemExit):
        dvn.main(["--variants", "decoupled_ppo+nonsense"])
