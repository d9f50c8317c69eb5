"""AlgoConfig presets and validation, the learner-facing calls, and equality with TRL's GRPO."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from areal_agents.config import load_config
from areal_agents.errors import ConfigError
from areal_agents.trainers import advantages as adv_mod
from areal_agents.trainers import losses as loss_mod
from areal_agents.trainers.algorithms import (
    PRESETS,
    AlgoConfig,
    compute_advantages,
    compute_policy_loss,
    register_advantage_estimator,
    register_loss,
)

D = torch.float64


def test_every_preset_builds_and_names_itself() -> None:
    assert set(PRESETS) >= {"ppo", "grpo", "dr_grpo", "dapo", "reinforce", "rloo", "reinforce_pp"}
    for name in PRESETS:
        c = AlgoConfig.from_name(name)
        assert c.name == name
    ppo = AlgoConfig.from_name("ppo")
    assert ppo.needs().critic and ppo.advantage == "gae"  # GAE declares it reads a critic
    dapo = AlgoConfig.from_name("dapo")
    assert (dapo.clip_eps_low, dapo.clip_eps_high, dapo.dynamic_sampling) == (0.2, 0.28, True)
    assert AlgoConfig.from_name("dr_grpo").aggregation == "seq_sum_norm"
    assert not AlgoConfig().needs().reference and AlgoConfig(kl_coef=0.04).needs().reference
    assert not AlgoConfig.from_name("grpo").needs().critic


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(advantage="grpoo"), "did you mean 'grpo'"),
        (dict(loss="ppo_clipp"), "did you mean 'ppo_clip'"),
        (dict(aggregation="token_meen"), "algo.aggregation.*did you mean 'token_mean'"),
        (dict(kl_estimator="k5"), "algo.kl_estimator"),
        (dict(dual_clip_c=0.5), "algo.dual_clip_c=0.5 must be > 1"),
        (dict(clip_eps_low=1.5), "algo.clip_eps_low"),
        (dict(gamma=1.5), "algo.gamma"),
        (dict(behavior_imp_mode="clip"), "algo.behavior_imp_mode"),
        (dict(baseline="ema"), "algo.baseline"),
    ],
)
def test_bad_values_fail_with_the_field_and_a_fix(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AlgoConfig(**kwargs)


def test_unknown_preset_suggests_a_name() -> None:
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        AlgoConfig.from_name("gpro")


def test_selected_from_the_command_line_as_a_config_group() -> None:
    @dataclass
    class Root:
        algo: AlgoConfig = field(default_factory=AlgoConfig)

    cfg = load_config(Root, ["algo.clip_eps_high=0.3", "algo=dapo", "algo.dual_clip_c=3"])
    assert cfg.algo.name == "dapo" and cfg.algo.clip_eps_high == 0.3 and cfg.algo.dual_clip_c == 3
    with pytest.raises(ConfigError, match="did you mean"):
        load_config(Root, ["algo=reinfroce"])


def test_policy_loss_combines_pg_kl_and_entropy_by_hand() -> None:
    c = AlgoConfig(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01, aggregation="token_mean")
    lp = torch.tensor([[-1.0, -2.0, 5.0]], dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    adv = torch.tensor([[1.0, -1.0, 0.0]], dtype=D)
    ref = torch.tensor([[-1.5, -2.0, 0.0]], dtype=D)
    ent = torch.tensor([[2.0, 4.0, 100.0]], dtype=D)
    loss, m = compute_policy_loss(c, lp, lp.detach(), lp.detach(), adv, mask, ref, ent)
    # ratio 1: pg = mean(-1, +1) = 0; k1 KL = mean(0.5, 0) = 0.25; entropy mean 3
    assert loss.item() == pytest.approx(0 + 0.1 * 0.25 - 0.01 * 3)
    assert m["kl_ref"].item() == pytest.approx(0.25) and m["entropy"].item() == pytest.approx(3)
    assert m["loss/policy"].item() == pytest.approx(0.0)
    loss.backward()
    # d/dlp: pg -A/2; kl +0.1/2 (k1); the entropy tensor is an input here (no grad path)
    assert lp.grad is not None
    assert lp.grad[0].tolist() == pytest.approx([-0.5 + 0.05, 0.5 + 0.05, 0.0])
    in_reward = c.replace(kl_in_reward=True)
    loss2, _ = compute_policy_loss(in_reward, lp, lp.detach(), lp.detach(), adv, mask, ref, ent)
    assert loss2.item() == pytest.approx(-0.01 * 3)  # the KL lives in the advantages then
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_policy_loss(c, lp, lp, lp, adv, mask, entropy=ent)
    with pytest.raises(ValueError, match="entropy"):
        compute_policy_loss(c, lp, lp, lp, adv, mask, ref)
    with pytest.raises(ValueError, match="advantages has shape"):
        compute_policy_loss(c, lp, lp, lp, adv[:, :2], mask, ref, ent)


def test_micro_batches_with_a_normalizer_add_up_to_the_batch() -> None:
    torch.manual_seed(1)
    c = AlgoConfig.from_name("dapo")
    mask = (torch.rand(6, 5) > 0.3).long()
    lp = torch.randn(6, 5, dtype=D)
    prox = lp + 0.3 * torch.randn(6, 5, dtype=D)
    adv = torch.randn(6, 5, dtype=D)
    full, _ = compute_policy_loss(c, lp, prox, prox, adv, mask)
    n = mask.sum()
    parts = [compute_policy_loss(c, lp[s], prox[s], prox[s], adv[s], mask[s], normalizer=n)[0]
             for s in (slice(0, 2), slice(2, 6))]  # fmt: skip
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), abs=1e-12)


def test_adding_an_algorithm_is_one_function_and_one_line() -> None:
    @register_advantage_estimator("test_constant")
    def constant(cfg: AlgoConfig, batch: adv_mod.AdvantageBatch) -> tuple[torch.Tensor, None]:
        return 2.0 * batch.mask, None

    @register_loss("test_linear")
    def linear(cfg, logprobs, proximal, behavior, advantages, mask):  # type: ignore[no-untyped-def]
        return -advantages * logprobs, {}

    try:
        c = AlgoConfig(advantage="test_constant", loss="test_linear")
        mask = torch.tensor([[1, 0]])
        adv, _ = compute_advantages(c, torch.zeros(1), mask, ["a"])
        assert adv.tolist() == [[2.0, 0.0]]
        lp = torch.tensor([[-1.0, -3.0]], requires_grad=True)
        loss, _ = compute_policy_loss(c, lp, lp.detach(), lp.detach(), adv, mask)
        assert loss.item() == pytest.approx(2.0)
    finally:
        adv_mod.ADVANTAGE_ESTIMATORS.pop("test_constant")
        loss_mod.POLICY_LOSSES.pop("test_linear")


# --- equality with TRL's GRPOTrainer loss -----------------------------------------------------


def _trl_loss(loss_type: str, inputs: dict[str, torch.Tensor], logps: torch.Tensor, **kw: Any):
    """Run ``GRPOTrainer._compute_loss`` itself on a minimal stand-in for the trainer.

    The stand-in provides only what the method reads; the per-token log-probs come from
    ``logps`` instead of a model forward pass. Returns the loss and TRL's logged metrics.
    """
    from trl import GRPOTrainer

    metrics: dict[str, defaultdict[str, list[float]]] = {"train": defaultdict(list)}
    accel = SimpleNamespace(
        reduce=lambda t, reduction="sum": t, gather=lambda t: t, gather_for_metrics=lambda t: t,
        num_processes=1, sync_gradients=True,
    )  # fmt: skip

    def per_token_logps(model: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        return logps, torch.zeros_like(logps), None

    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=per_token_logps,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        loss_type=loss_type,
        epsilon_low=kw.get("eps_low", 0.2),
        epsilon_high=kw.get("eps_high", 0.2),
        beta=kw.get("beta", 0.0),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        use_vllm=kw.get("use_vllm", False),
        vllm_importance_sampling_correction=True,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=kw.get("max_len", 0),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        accelerator=accel,
        _metrics=metrics,
    )
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    return loss, metrics["train"]


def test_equals_trl_grpo_loss_where_definitions_coincide() -> None:
    """Same inputs through TRL's GRPOTrainer loss and ours: loss, gradient and clip metrics."""
    from trl.trainer.utils import nanstd

    g = torch.Generator().manual_seed(0)
    B, P, T = 6, 3, 9
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.0])
    groups = ["a", "a", "a", "b", "b", "b"]  # TRL's layout: num_generations consecutive samples
    completion_mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate([9, 4, 7, 1, 9, 5]):
        completion_mask[b, :n] = 1
    tool_mask = torch.ones(B, T, dtype=torch.long)
    tool_mask[0, 3:5] = 0  # a multi-turn row: tool tokens inside the completion
    tool_mask[4, 2] = 0
    mask = completion_mask * tool_mask
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    logps = old + torch.randn(B, T, generator=g, dtype=D) * 0.4  # ratios both sides of the clip
    ref = old + torch.randn(B, T, generator=g, dtype=D) * 0.2
    sampling = old + torch.randn(B, T, generator=g, dtype=D) * 0.8  # the inference engine's

    # TRL's group advantage, with TRL's own nanstd: (r - group mean) / (group std + 1e-4)
    grouped = rewards.view(-1, 3)
    trl_adv = (grouped - grouped.mean(1, keepdim=True)) / (nanstd(grouped, dim=1) + 1e-4)[:, None]
    ours_adv, _ = compute_advantages(
        AlgoConfig(adv_eps=1e-4), rewards.to(D), mask, groups
    )  # [B, T]
    for b in range(B):
        row = ours_adv[b][mask[b].bool()]
        assert torch.allclose(row, trl_adv.flatten()[b].to(D).expand_as(row), atol=1e-6)

    def inputs() -> dict[str, torch.Tensor]:
        return {
            "prompt_ids": torch.zeros(B, P, dtype=torch.long), "prompt_mask": torch.ones(B, P),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": completion_mask, "tool_mask": tool_mask,
            "advantages": trl_adv.flatten().to(D), "old_per_token_logps": old,
            "ref_per_token_logps": ref, "num_items_in_batch": mask.sum(),
        }  # fmt: skip

    cases = [  # TRL loss_type, TRL knobs, our config
        ("grpo", {}, AlgoConfig.from_name("grpo")),
        ("bnpo", dict(beta=0.04), AlgoConfig(aggregation="token_mean", kl_coef=0.04)),
        ("dr_grpo", dict(max_len=16), AlgoConfig.from_name("dr_grpo").replace(norm_tokens=16)),
        ("dapo", dict(eps_high=0.28, beta=0.1), AlgoConfig.from_name("dapo").replace(kl_coef=0.1)),
    ]
    for loss_type, knobs, cfg in cases:
        lp_trl = logps.clone().requires_grad_(True)
        trl_loss, trl_metrics = _trl_loss(loss_type, inputs(), lp_trl, **knobs)
        trl_loss.backward()
        lp_ours = logps.clone().requires_grad_(True)
        ours, m = compute_policy_loss(cfg, lp_ours, old, old, ours_adv, mask, ref)
        ours.backward()
        assert abs(ours.item() - trl_loss.item()) < 1e-6, loss_type
        torch.testing.assert_close(lp_ours.grad, lp_trl.grad, rtol=0, atol=1e-6)
        assert m["clip/low_frac"].item() == pytest.approx(trl_metrics["clip_ratio/low_mean"][0])
        assert m["clip/high_frac"].item() == pytest.approx(trl_metrics["clip_ratio/high_mean"][0])
        assert m["clip/frac"].item() == pytest.approx(trl_metrics["clip_ratio/region_mean"][0])
        if cfg.kl_coef:
            assert m["kl_ref"].item() == pytest.approx(trl_metrics["kl"][0])

    # The decoupled objective is TRL's vLLM importance-sampling correction: the trust region
    # around the trainer's old policy, times min(pi_old / pi_sampler, cap) per token.
    for mode, trl_ratio in (
        ("truncate", torch.exp(old - sampling).clamp(max=2.0)),
        ("mask", torch.exp(old - sampling).masked_fill(torch.exp(old - sampling) > 2.0, 0.0)),
    ):
        batch = inputs() | {"importance_sampling_ratio": trl_ratio}
        lp_trl = logps.clone().requires_grad_(True)
        trl_loss, _ = _trl_loss("bnpo", batch, lp_trl, use_vllm=True)
        trl_loss.backward()
        cfg = AlgoConfig(loss="decoupled_ppo", behavior_imp_cap=2.0, behavior_imp_mode=mode)
        lp_ours = logps.clone().requires_grad_(True)
        ours, m = compute_policy_loss(cfg, lp_ours, old, sampling, ours_adv, mask)
        ours.backward()
        assert m["behavior/capped_frac"].item() > 0  # the cap was exercised
        assert abs(ours.item() - trl_loss.item()) < 1e-6, mode
        torch.testing.assert_close(lp_ours.grad, lp_trl.grad, rtol=0, atol=1e-6)
    assert math.isfinite(ours.item())
