"""Every algorithm preset and every non-default ``algo.*`` value has its effect, and every
``algo.*``, ``trainer.*`` and ``eval.*`` key has a test (``COVERED``).

Learner-level keys run through :meth:`Learner.train_step` on the tiny model (``model=tiny``, one
rank in this process, gloo), on a 4-row batch whose behaviour log-probs are the model's own plus
a chosen offset, so that ratios are known: ``offset=-0.5`` makes ``pi / pi_behav = e^0.5``
(``tests/trainers/_tiny_learner.py``). The ``trainer.*`` keys are checked in
``test_every_trainer_key.py``. ``COVERED`` maps every config key to the test that checks it; a
key without one fails :func:`test_every_key_has_a_check`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.errors import ConfigError
from areal_agents.trainers.algorithms import PRESETS, AlgoConfig
from areal_agents.trainers.config import HeldOutConfig, TrainConfig, TrainerConfig
from tests.trainers._tiny_learner import (
    A,
    algo,
    batch,
    largest_change,
    learner,
    params,
    process_group,  # noqa: F401  (the autouse fixture)
    row,
    step,
)

# ---- presets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_trains_the_tiny_model(preset: str) -> None:
    lrn = learner(preset)
    before = params(lrn)
    metrics = lrn.train_step(batch(offset=-0.1))
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["grad_norm"] > 0 and largest_change(before, params(lrn)) > 0
    critic = lrn.spec.algo.needs().critic
    assert (lrn.critic is not None) == critic == (preset == "ppo")
    assert ("value/grad_norm" in metrics) == critic
    assert metrics["advantage/abs_mean"] > 0


# ---- algo.*: the loss ------------------------------------------------------------------------


def test_loss_decoupled_ppo_takes_the_ratio_against_the_step_start_policy() -> None:
    stale = batch(offset=-2.0)  # pi / pi_behav = e^2, above the cap 5
    ppo = step(algo(loss="ppo_clip"), stale)
    dec = step(algo(loss="decoupled_ppo"), stale)
    assert ppo["ratio/mean"] == pytest.approx(math.exp(2.0), rel=1e-3)
    assert dec["ratio/mean"] == pytest.approx(1.0, abs=1e-4)  # one update: current, detached
    assert dec["behavior/weight/mean"] == pytest.approx(math.exp(2.0), rel=1e-3)
    assert dec["behavior/capped_frac"] == 1.0
    two = learner(algo(loss="decoupled_ppo"), ppo_epochs=2)
    assert two.needs.proximal_pass and not learner(algo(), ppo_epochs=2).needs.proximal_pass


def test_keep_per_group_trains_each_groups_most_varied_rewards() -> None:
    # groups of 4 with rewards 1, 0.5, 0.5, 0: the most varied pair is the 1 and the 0, whose
    # GRPO advantages among themselves are +-A; the learner trains exactly those two rows
    rewards = (1.0, 0.5, 0.5, 0.0)
    full = [row(g, r, seed=i) for g in ("a", "b") for i, r in enumerate(rewards)]
    pair = [t for t in full if t.reward in (1.0, 0.0)]
    down = step(algo(keep_per_group=2), full)
    alone = step("grpo", pair)
    assert down["filter/downsampled_rows"] == 4 and down["learner/rows_trained"] == 4
    assert down["advantage/abs_mean"] == pytest.approx(A, rel=1e-5)  # adv_eps in the std
    assert down["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-5)
    assert down["loss/policy"] == pytest.approx(alone["loss/policy"], abs=1e-6)
    every = step("grpo", full)  # without it: advantages against the group of 4 (std 0.41)
    assert "filter/downsampled_rows" not in every
    assert every["advantage/abs_mean"] == pytest.approx(0.5 / math.sqrt(1 / 6) / 2, rel=1e-5)
    with pytest.raises(ConfigError, match="at least 2"):
        algo(keep_per_group=1)
    with pytest.raises(ConfigError, match=r"env\.group_size"):
        TrainConfig(algo=algo(keep_per_group=4))  # the default group of 4: nothing dropped


def test_clip_eps_low_and_high() -> None:
    low = batch(offset=0.5)  # ratio e^-0.5 = 0.61: clipped below 0.8 where A < 0
    assert step("grpo", low)["clip/low_frac"] == pytest.approx(0.5)
    assert step(algo(clip_eps_low=0.5), low)["clip/low_frac"] == 0.0
    high = batch(offset=-0.5)  # ratio e^0.5 = 1.65: clipped above 1.2 where A > 0
    assert step("grpo", high)["clip/high_frac"] == pytest.approx(0.5)
    assert step(algo(clip_eps_high=0.8), high)["clip/high_frac"] == 0.0


def test_dual_clip_c_bounds_negative_advantage_tokens() -> None:
    far = batch(offset=-1.5)  # ratio e^1.5 = 4.5 > c = 3
    assert step("grpo", far)["clip/dual_frac"] == 0.0
    assert step(algo(dual_clip_c=3.0), far)["clip/dual_frac"] == pytest.approx(0.5)


def test_behavior_imp_cap_and_mode() -> None:
    stale = batch(offset=-2.0)  # w = e^2 = 7.4 > 5 on every token
    assert (
        step(algo(loss="decoupled_ppo", behavior_imp_cap=None), stale)["behavior/capped_frac"]
        == 0.0
    )
    truncate = step(algo(loss="decoupled_ppo", behavior_imp_mode="truncate"), stale)
    masked = step(algo(loss="decoupled_ppo"), stale)  # the default mode masks
    assert truncate["grad_norm"] > 0
    assert masked["grad_norm"] == 0.0 and masked["loss/policy"] == 0.0  # every token dropped


def test_behavior_imp_level_agg_and_floor() -> None:
    """w = e^0.5 = 1.65 on every token (under the cap 5): a turn of 5 tokens has the product
    e^2.5 = 12.2 and one of 3 e^1.5 = 4.5, the sequence e^4 = 55; geometric means stay 1.65."""
    stale = batch(offset=-0.5)
    base = dict(loss="decoupled_ppo", behavior_imp_mode="mask")
    token = step(algo(**base), stale)
    assert token["behavior/masked_frac"] == 0.0 and token["grad_norm"] > 0
    geo = step(algo(**base, behavior_imp_level="sequence"), stale)
    assert geo["behavior/masked_frac"] == 0.0
    seq = step(algo(**base, behavior_imp_level="sequence", behavior_imp_agg="product"), stale)
    assert seq["behavior/masked_frac"] == 1.0 and seq["behavior/masked_seqs"] == 4
    assert seq["grad_norm"] == 0.0
    turn = step(algo(**base, behavior_imp_level="turn", behavior_imp_agg="product"), stale)
    assert turn["behavior/masked_frac"] == pytest.approx(5 / 8)  # the 5-token turns
    assert turn["behavior/masked_seqs"] == 4 and turn["grad_norm"] > 0
    floor = step(algo(**base, behavior_imp_floor=2.0), stale)
    assert floor["behavior/masked_frac"] == 1.0 and floor["grad_norm"] == 0.0


def test_a_group_placebo_trains_only_the_groups_the_real_run_trains() -> None:
    """Group a earned 1 and 0, b 1 and 1, c 0 and 0: the real run trains a's rows only. The
    batch placebo may give b and c mixed rewards; the group placebo keeps them uniform
    (advantage 0: not forwarded) and a's advantages, at random signs."""
    rows = [row("a", 1.0, seed=5), row("a", 0.0, seed=6)]
    rows += [row("b", 1.0, seed=7), row("b", 1.0, seed=8)]
    rows += [row("c", 0.0, seed=9), row("c", 0.0, seed=10)]
    assert learner().train_step(rows)["learner/rows_trained"] == 2
    for seed in range(8):  # the placebo's draw depends on the trainer seed
        grouped = learner(algo(shuffle_rewards=True, shuffle_scope="group"), seed=seed)
        m = grouped.train_step(rows)
        assert m["learner/rows_trained"] == 2 and m["filter/shuffled_rewards"] == 1.0
    batch_draws = {
        learner(algo(shuffle_rewards=True), seed=seed).train_step(rows)["learner/rows_trained"]
        for seed in range(8)
    }
    assert max(batch_draws) > 2  # some batch draw mixes b's or c's rewards: more rows train
    with pytest.raises(ConfigError, match="shuffle_scope"):
        algo(shuffle_scope="task")


def test_shuffle_rewards_is_a_placebo_of_the_same_size() -> None:
    rows = [
        row(g, r, seed=i) for i, (g, r) in enumerate(zip("aabbccdd", [1.0, 0.0] * 4, strict=True))
    ]
    real, placebo = learner(), learner(algo(shuffle_rewards=True))
    before = params(real)
    m_real, m_placebo = real.train_step(rows), placebo.train_step(rows)
    assert m_placebo["filter/shuffled_rewards"] == 1.0 and "filter/shuffled_rewards" not in m_real
    assert largest_change(params(real), params(placebo)) > 0  # a different update...
    assert largest_change(before, params(placebo)) == pytest.approx(
        largest_change(before, params(real)), rel=0.5
    )  # ...of the same size (Adam: about lr per weight)


def test_max_log_ratio_clamps_the_ratio() -> None:
    out = step(algo(max_log_ratio=0.1), batch(offset=-0.5))
    assert out["ratio/max"] == pytest.approx(math.exp(0.1), rel=1e-4)


def test_aggregation_and_norm_tokens() -> None:
    # ratio 1, so the per-token loss is -A; rows of 8 and 3 policy tokens, A = +-A per group
    data = [row(g, r, (5, 3) if r else (2, 1)) for g in ("a", "b") for r in (1.0, 0.0)]
    n_pos, n_neg = 8, 3
    token_sum = -(2 * n_pos * A - 2 * n_neg * A)
    expected = {
        "token_mean": token_sum / (2 * n_pos + 2 * n_neg),
        "seq_mean_token_mean": 0.0,  # the mean of per-row means: -A, +A, -A, +A
        # without norm_tokens: B x the longest row's policy tokens (not the padded width)
        "seq_sum_norm": token_sum / (4 * n_pos),
    }
    for mode, value in expected.items():
        assert step(algo(aggregation=mode), data)["loss/policy"] == pytest.approx(value, abs=1e-5)
    normed = step(algo(aggregation="seq_sum_norm", norm_tokens=100), data)["loss/policy"]
    assert normed == pytest.approx(token_sum / (4 * 100), abs=1e-6)


def test_kl_coef_kl_estimator_and_kl_in_reward() -> None:
    base = step("grpo")
    assert "kl_ref" not in base and learner("grpo").ref is None
    lrn = learner(algo(kl_coef=1.0))
    k3 = lrn.train_step(batch())
    assert lrn.ref is not None and k3["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    # at ref == current, k3's gradient is 0 and k1's (d/dlp of lp - ref = 1) is not
    assert k3["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-4)
    k1 = step(algo(kl_coef=1.0, kl_estimator="k1"))
    assert k1["grad_norm"] != pytest.approx(base["grad_norm"], rel=1e-2)
    k2 = step(algo(kl_coef=1.0, kl_estimator="k2"))  # d/dlp of (lp - ref)^2 / 2 = 0 too
    assert k2["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-4)
    # in the reward: no KL term in the loss, the penalty moves the advantages instead
    # rows of 8 and 3 policy tokens: the per-token penalty adds up to different row totals
    stale = [row(g, r, (5, 3) if r else (2, 1), offset=-0.5) for g in "ab" for r in (1.0, 0.0)]
    in_loss = step(algo("dr_grpo", kl_coef=0.5), stale)
    in_reward = step(algo("dr_grpo", kl_coef=0.5, kl_in_reward=True), stale)
    assert "loss/kl" in in_loss and "loss/kl" not in in_reward and "kl_ref" in in_reward
    assert in_loss["advantage/abs_mean"] == pytest.approx(0.5)  # r - group mean, r in {0, 1}
    k3 = math.exp(0.5) - 1 - 0.5  # per token: behaviour - ref = -0.5
    gap = 1 - 0.5 * k3 * (8 - 3)  # the rewarded row pays for 8 tokens, the other for 3
    assert in_reward["advantage/abs_mean"] == pytest.approx(gap / 2, rel=1e-4)


def test_kl_rows_no_signal_anchors_only_the_rows_without_an_advantage() -> None:
    # k1 at ref == current: a gradient of 1 per token wherever the KL is a loss
    k1 = algo(kl_coef=1.0, kl_estimator="k1", kl_rows="no_signal")
    mixed = step(k1)  # both groups have a reward spread: no row is anchored
    assert mixed["kl/anchored_frac"] == 0.0
    assert mixed["grad_norm"] == pytest.approx(step("grpo")["grad_norm"], rel=1e-4)
    uniform = [row("a", 1.0), row("a", 0.0), row("b", 1.0, seed=1), row("b", 1.0, seed=2)]
    anchored = step(k1, uniform)  # group b's rows (half the tokens) carry the KL alone
    assert anchored["kl/anchored_frac"] == pytest.approx(0.5)
    assert anchored["learner/rows_trained"] == 4  # the anchored rows are trained too
    assert anchored["grad_norm"] != pytest.approx(step("grpo", uniform)["grad_norm"], rel=1e-2)
    everywhere = step(algo(kl_coef=1.0, kl_estimator="k1"), uniform)
    assert everywhere["kl/anchored_frac"] == 1.0
    assert anchored["grad_norm"] != pytest.approx(everywhere["grad_norm"], rel=1e-2)


def test_entropy_coef_subtracts_the_entropy_bonus() -> None:
    out = step(algo(entropy_coef=0.01))
    assert out["loss/entropy"] > 0
    assert out["loss/total"] == pytest.approx(out["loss/policy"] - 0.01 * out["loss/entropy"])
    assert "loss/entropy" not in step("grpo")


# ---- algo.*: advantages ----------------------------------------------------------------------


def test_grpo_std_keys_change_the_advantages_as_documented() -> None:
    assert step("grpo")["advantage/abs_mean"] == pytest.approx(A, rel=1e-4)
    assert step(algo(std_normalize=False))["advantage/abs_mean"] == pytest.approx(0.5)
    assert step(algo(std_unbiased=False))["advantage/abs_mean"] == pytest.approx(1.0, rel=1e-4)
    assert step(algo(adv_eps=1.0))["advantage/abs_mean"] == pytest.approx(0.5 / (A + 1.0))
    # batch scope: group b is uniform (adv 0); group a is divided by the batch's std
    data = [row("a", 1.0), row("a", 0.0), row("b", 1.0), row("b", 1.0)]
    batch_std = float(torch.tensor([1.0, 0.0, 1.0, 1.0]).std())
    out = step(algo(std_scope="batch"), data)["advantage/abs_mean"]
    assert out == pytest.approx((0.5 / batch_std) / 2, rel=1e-4)
    n = 4 * 8  # whitened over all policy tokens: +-sqrt((n - 1) / n)
    white = step(algo(whiten_advantages=True))["advantage/abs_mean"]
    assert white == pytest.approx(math.sqrt((n - 1) / n), rel=1e-4)


def test_positive_and_negative_scale_weigh_the_advantages_of_one_sign() -> None:
    full = step("grpo")  # one row of +A and one of -A per group, 8 tokens each
    assert full["advantage/mean"] == pytest.approx(0.0, abs=1e-6)
    half = step(algo(negative_scale=0.5))
    assert half["advantage/abs_mean"] == pytest.approx(0.75 * A, rel=1e-4)
    assert half["advantage/mean"] == pytest.approx(0.25 * A, rel=1e-4)
    positive = step(algo(negative_scale=0.0))  # RAFT-like: the better rows only
    assert positive["advantage/abs_mean"] == pytest.approx(0.5 * A, rel=1e-4)
    # a row whose advantage is 0 everywhere is not trained: only the two better rows are
    assert positive["advantage/mean"] == pytest.approx(A, rel=1e-4)
    assert positive["learner/rows_trained"] == 2 and full["learner/rows_trained"] == 4
    # applied after whitening, which would otherwise centre the tilt away
    white = step(algo(whiten_advantages=True, negative_scale=0.0))
    assert white["advantage/mean"] > 0.4
    negative = step(algo(positive_scale=0.0))  # NSR: the worse rows only, pushed down
    assert negative["advantage/mean"] == pytest.approx(-A, rel=1e-4)
    assert negative["learner/rows_trained"] == 2
    w_reinforce = step(algo(positive_scale=0.1))
    assert w_reinforce["advantage/abs_mean"] == pytest.approx(0.55 * A, rel=1e-4)
    for key in ("positive_scale", "negative_scale"):
        for bad in (-0.1, 1.5):
            with pytest.raises(ConfigError, match=key):
                algo(**{key: bad})
    with pytest.raises(ConfigError, match="both 0"):
        algo(positive_scale=0.0, negative_scale=0.0)


def test_running_baseline_moves_and_is_checkpointed(tmp_path: Path) -> None:
    lrn = learner(algo("reinforce", baseline="running"))
    first = lrn.train_step(batch())  # rewards 1, 0, 1, 0: the first batch sets b = 0.5
    assert first["baseline/running"] == 0.5 and first["advantage/abs_mean"] == 0.5
    ones = [row(g, 1.0, seed=s) for g in ("a", "b") for s in (1, 2)]
    second = lrn.train_step(ones)  # advantages against the old b: 1 - 0.5
    assert second["advantage/abs_mean"] == pytest.approx(0.5)
    assert second["baseline/running"] == pytest.approx(0.9 * 0.5 + 0.1 * 1.0)
    lrn.save_checkpoint(str(tmp_path))
    again = learner(algo("reinforce", baseline="running"))
    assert again.baseline is not None and again.baseline.value == 0.0
    again.load_checkpoint(str(tmp_path))
    assert again.baseline.state_dict() == lrn.baseline.state_dict()  # type: ignore[union-attr]
    batch_mean = step(algo("reinforce"), ones)["advantage/abs_mean"]  # batch baseline: 1 - 1
    assert batch_mean == 0.0
    assert step(algo("reinforce", baseline="none"))["advantage/abs_mean"] == pytest.approx(0.5)


def test_gamma_and_lam_discount_gae_over_policy_tokens() -> None:
    # the critic's head starts at 0, so GAE's advantage of a token k steps before the end is
    # (gamma * lam)^k * r; rows of 8 policy tokens, rewards 1, 0, 1, 0
    def gae(**kw: Any) -> float:
        cfg = AlgoConfig(advantage="gae", whiten_advantages=False, **kw)
        return step(cfg)["advantage/abs_mean"]

    def expected(decay: float) -> float:
        return 2 * sum(decay**k for k in range(8)) / 32

    assert gae() == pytest.approx(expected(1.0), rel=1e-5)
    assert gae(gamma=0.5) == pytest.approx(expected(0.5), rel=1e-5)
    assert gae(lam=0.5) == pytest.approx(expected(0.5), rel=1e-5)


def test_vf_coef_scales_the_critic_gradient_and_vf_clip_bounds_it() -> None:
    half = step(algo("ppo"))
    full = step(algo("ppo", vf_coef=1.0))
    assert full["value/grad_norm"] == pytest.approx(2 * half["value/grad_norm"], rel=1e-4)
    # on the second epoch the values have moved from the old ones: a tiny clip range bites
    tiny = step(algo("ppo", vf_clip=1e-6), ppo_epochs=2, lr=1e-2)
    free = step(algo("ppo", vf_clip=None), ppo_epochs=2, lr=1e-2)
    assert tiny["value/clip_frac"] > 0 and free["value/clip_frac"] == 0.0


def test_overlong_buffer_and_penalty_shape_the_reward() -> None:
    # turns of 5 and 3 tokens against a limit of 8: buffer 4 starts at 4, so -1/4 * penalty
    out = step(algo(overlong_buffer=4))
    assert out["filter/overlong_penalty"] == pytest.approx(-0.25)
    assert out["filter/overlong_rows"] == 4.0
    doubled = step(algo(overlong_buffer=4, overlong_penalty=2.0))
    assert doubled["filter/overlong_penalty"] == pytest.approx(-0.5)
    assert "filter/overlong_penalty" not in step("grpo")
    # a shorter row is not penalised, so its group's advantages change
    data = [row("a", 1.0, (2, 1)), row("a", 1.0), row("b", 1.0), row("b", 0.0)]
    shaped = step(algo(overlong_buffer=4), data)
    assert shaped["filter/overlong_rows"] == 3.0
    assert shaped["advantage/abs_mean"] != pytest.approx(step("grpo", data)["advantage/abs_mean"])


def test_mask_truncated_row_contributes_no_gradient() -> None:
    data = [row("a", 1.0, truncated=True), row("a", 0.0), row("b", 1.0), row("b", 0.0)]
    zeroed = [dataclasses.replace(data[0], loss_mask=(0,) * len(data[0].loss_mask)), *data[1:]]
    masked = learner(algo(mask_truncated=True))
    by_hand = learner("grpo")
    plain = learner("grpo")
    start = params(masked)
    out = masked.train_step(data)
    by_hand.train_step(zeroed)
    plain.train_step(data)
    assert out["filter/truncated_masked_rows"] == 1.0
    # the same update as with that row's loss mask zeroed (its reward still sets the baseline)
    assert largest_change(params(masked), params(by_hand)) < 1e-7
    assert largest_change(params(masked), params(plain)) > 1e-5
    assert largest_change(start, params(masked)) > 1e-5


def test_name_labels_the_run_directory() -> None:
    cfg = TrainConfig(algo=AlgoConfig.from_name("grpo").replace(name="my_grpo"))
    assert cfg.run_dir().name == "code_sandbox-my_grpo"


# ---- every key has a check -------------------------------------------------------------------

TRAINER = "tests/trainers/test_every_trainer_key.py::"  # the trainer.* keys' tests

#: config key -> the test that checks its effect (tests in other files are named by path,
#: and by ``path::test`` where the file checks several keys).
COVERED: dict[str, str] = {
    "algo.advantage": "test_every_preset_trains_the_tiny_model",
    "algo.name": "test_name_labels_the_run_directory",
    "algo.loss": "test_loss_decoupled_ppo_takes_the_ratio_against_the_step_start_policy",
    "algo.clip_eps_low": "test_clip_eps_low_and_high",
    "algo.clip_eps_high": "test_clip_eps_low_and_high",
    "algo.dual_clip_c": "test_dual_clip_c_bounds_negative_advantage_tokens",
    "algo.behavior_imp_cap": "test_behavior_imp_cap_and_mode",
    "algo.behavior_imp_mode": "test_behavior_imp_cap_and_mode",
    "algo.behavior_imp_level": "test_behavior_imp_level_agg_and_floor",
    "algo.behavior_imp_agg": "test_behavior_imp_level_agg_and_floor",
    "algo.behavior_imp_floor": "test_behavior_imp_level_agg_and_floor",
    "algo.shuffle_rewards": "test_shuffle_rewards_is_a_placebo_of_the_same_size",
    "algo.shuffle_scope": "test_a_group_placebo_trains_only_the_groups_the_real_run_trains",
    "algo.aggregation": "test_aggregation_and_norm_tokens",
    "algo.norm_tokens": "test_aggregation_and_norm_tokens",
    "algo.kl_coef": "test_kl_coef_kl_estimator_and_kl_in_reward",
    "algo.kl_estimator": "test_kl_coef_kl_estimator_and_kl_in_reward",
    "algo.kl_in_reward": "test_kl_coef_kl_estimator_and_kl_in_reward",
    "algo.kl_rows": "test_kl_rows_no_signal_anchors_only_the_rows_without_an_advantage",
    "algo.entropy_coef": "test_entropy_coef_subtracts_the_entropy_bonus",
    "algo.std_normalize": "test_grpo_std_keys_change_the_advantages_as_documented",
    "algo.std_scope": "test_grpo_std_keys_change_the_advantages_as_documented",
    "algo.std_unbiased": "test_grpo_std_keys_change_the_advantages_as_documented",
    "algo.adv_eps": "test_grpo_std_keys_change_the_advantages_as_documented",
    "algo.whiten_advantages": "test_grpo_std_keys_change_the_advantages_as_documented",
    "algo.positive_scale": "test_positive_and_negative_scale_weigh_the_advantages_of_one_sign",
    "algo.negative_scale": "test_positive_and_negative_scale_weigh_the_advantages_of_one_sign",
    "algo.replay_coef": "tests/trainers/test_replay.py::"
    "test_replay_adds_the_demonstrations_loss_to_every_update",
    "algo.replay_demos": "tests/trainers/test_replay.py::"
    "test_replay_demos_sizes_the_pool_of_non_held_out_demonstrations",
    "algo.baseline": "test_running_baseline_moves_and_is_checkpointed",
    "algo.gamma": "test_gamma_and_lam_discount_gae_over_policy_tokens",
    "algo.lam": "test_gamma_and_lam_discount_gae_over_policy_tokens",
    "algo.vf_coef": "test_vf_coef_scales_the_critic_gradient_and_vf_clip_bounds_it",
    "algo.vf_clip": "test_vf_coef_scales_the_critic_gradient_and_vf_clip_bounds_it",
    "algo.max_log_ratio": "test_max_log_ratio_clamps_the_ratio",
    "algo.dynamic_sampling": (
        TRAINER + "test_batch_order_seed_and_dynamic_sampling_reach_the_buffer"
    ),
    "algo.task_sampling": "tests/trainers/test_curriculum.py::"
    "test_task_sampling_changes_the_tasks_the_buffer_admits_and_resumes_them",
    "algo.keep_per_group": "test_keep_per_group_trains_each_groups_most_varied_rewards",
    "algo.overlong_buffer": "test_overlong_buffer_and_penalty_shape_the_reward",
    "algo.overlong_penalty": "test_overlong_buffer_and_penalty_shape_the_reward",
    "algo.mask_truncated": "test_mask_truncated_row_contributes_no_gradient",
    "trainer.mode": TRAINER + "test_mode_max_staleness_and_groups_per_step_bound_admission",
    "trainer.max_staleness": (
        TRAINER + "test_mode_max_staleness_and_groups_per_step_bound_admission"
    ),
    "trainer.groups_per_step": (
        TRAINER + "test_mode_max_staleness_and_groups_per_step_bound_admission"
    ),
    "trainer.total_steps": TRAINER + "test_checkpoint_every_and_total_steps",
    "trainer.batch_order": TRAINER + "test_batch_order_seed_and_dynamic_sampling_reach_the_buffer",
    "trainer.seed": TRAINER + "test_batch_order_seed_and_dynamic_sampling_reach_the_buffer",
    "trainer.lr": TRAINER + "test_lr_warmup_and_schedules",
    "trainer.warmup_steps": TRAINER + "test_lr_warmup_and_schedules",
    "trainer.lr_schedule": TRAINER + "test_lr_warmup_and_schedules",
    "trainer.weight_decay": TRAINER + "test_weight_decay_and_betas",
    "trainer.betas": TRAINER + "test_weight_decay_and_betas",
    "trainer.optimizer": TRAINER + "test_optimizer_sgd_moves_each_weight_by_its_gradient",
    "trainer.sgd_momentum": TRAINER + "test_optimizer_sgd_moves_each_weight_by_its_gradient",
    "trainer.max_grad_norm": TRAINER + "test_max_grad_norm_clips_the_update",
    "trainer.probe_tokens": (
        TRAINER + "test_probe_tokens_measure_the_update_and_target_kl_brakes_the_lr"
    ),
    "trainer.target_kl": TRAINER
    + "test_probe_tokens_measure_the_update_and_target_kl_brakes_the_lr",
    "trainer.micro_batch_tokens": TRAINER + "test_micro_batch_tokens_split_the_work_not_the_update",
    "trainer.share_prompt_prefix": (
        TRAINER + "test_share_prompt_prefix_runs_the_shared_prefix_once_and_changes_nothing_else"
    ),
    "trainer.ppo_epochs": TRAINER + "test_ppo_epochs_and_minibatches_are_optimizer_updates",
    "trainer.minibatches": TRAINER + "test_ppo_epochs_and_minibatches_are_optimizer_updates",
    "trainer.torch_threads": TRAINER + "test_torch_threads_and_seed_reach_the_learner",
    "trainer.rollout_workers": (
        TRAINER + "test_rollout_workers_and_concurrent_groups_shape_the_workers"
    ),
    "trainer.max_concurrent_groups": (
        TRAINER + "test_rollout_workers_and_concurrent_groups_shape_the_workers"
    ),
    "trainer.checkpoint_every": TRAINER + "test_checkpoint_every_and_total_steps",
    "trainer.checkpoint_interval_s": TRAINER + "test_checkpoint_interval_s_saves_by_time",
    "trainer.learner_ranks": "tests/trainers/test_fsdp_equivalence.py",
    "trainer.learner_cpus": (
        TRAINER + "test_learner_cpus_and_inference_cpus_place_the_learner_and_the_rollout_workers"
    ),
    "trainer.overlap_weight_push": (
        "tests/trainers/test_weight_sync.py::"
        "test_push_step_overlaps_only_when_asked_and_joins_the_previous_push"
    ),
    "trainer.keep_checkpoints": "tests/trainers/test_checkpoint.py",
    "trainer.resume": "tests/test_train.py",
    "trainer.time_budget_s": "tests/test_train.py",
    "eval.held_out_tasks": "tests/trainers/test_held_out.py",
    "eval.seed": "tests/trainers/test_held_out.py",
    "eval.concurrency": "tests/trainers/test_held_out.py::"
    "test_eval_concurrency_is_how_many_held_out_episodes_play_at_once",
    "eval.before": "tests/test_train.py",
    "eval.temperature": "tests/test_train.py",
    "eval.validation_tasks": "tests/trainers/test_selection.py",
    "eval.validation_every": "tests/trainers/test_selection.py",
}


def test_every_key_has_a_check() -> None:
    keys = {f"algo.{f.name}" for f in dataclasses.fields(AlgoConfig)}
    keys |= {f"trainer.{f.name}" for f in dataclasses.fields(TrainerConfig)}
    keys |= {f"eval.{f.name}" for f in dataclasses.fields(HeldOutConfig)}
    assert sorted(keys - set(COVERED)) == [], "a config key without a test of its effect"
    assert sorted(set(COVERED) - keys) == [], "a test table entry for a key that is gone"
    root = Path(__file__).resolve().parents[2]
    for target in set(COVERED.values()):
        if target.startswith("tests/"):
            path, _, name = target.partition("::")
            assert (root / path).is_file(), target
            assert not name or f"def {name}(" in (root / path).read_text(), target
        else:
            assert callable(globals().get(target)), target
