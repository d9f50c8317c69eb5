"""Advantage estimators: hand-worked numbers, ragged multi-turn masks, and a loop reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from areal_agents.errors import ConfigError
from areal_agents.trainers.advantages import (
    RunningBaseline,
    get_advantage_estimator,
    spread_token_rewards,
)
from areal_agents.trainers.algorithms import AlgoConfig, compute_advantages
from areal_agents.trainers.masked import masked_mean, masked_var, masked_whiten

D = torch.float64


def cfg(name: str, **kw: object) -> AlgoConfig:
    return AlgoConfig.from_name(name).replace(**kw)


# --- hand-worked numbers ---------------------------------------------------------------------


def test_grpo_group_mean_and_unbiased_std() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=D)
    adv, ret = compute_advantages(cfg("grpo"), rewards, mask, ["a", "a", "b", "b"])
    # group a: mean 0.5, std sqrt(0.5); group b: all equal -> 0
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = torch.tensor([[a, a, 0], [-a, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=D)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
    assert ret is None


def test_grpo_biased_std_and_batch_scope() -> None:
    mask = torch.ones(4, 1)
    r = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=D)
    ids = ["a", "a", "b", "b"]
    biased, _ = compute_advantages(cfg("grpo", std_unbiased=False, adv_eps=1e-12), r, mask, ids)
    torch.testing.assert_close(biased[:, 0], torch.tensor([1.0, -1.0, 0, 0], dtype=D))
    # batch std of [1, 0, 1, 1] (unbiased) is 0.5; centring stays per group
    batch, _ = compute_advantages(cfg("grpo", std_scope="batch", adv_eps=1e-12), r, mask, ids)
    torch.testing.assert_close(batch[:, 0], torch.tensor([1.0, -1.0, 0, 0], dtype=D))


def test_dr_grpo_only_centres() -> None:
    r = torch.tensor([3.0, 1.0, 5.0, 5.0], dtype=D)
    adv, _ = compute_advantages(cfg("dr_grpo"), r, torch.ones(4, 2), ["a", "a", "b", "b"])
    torch.testing.assert_close(adv[:, 1], torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=D))
    # grpo with std_normalize off is the same thing
    same, _ = compute_advantages(
        cfg("grpo", std_normalize=False), r, torch.ones(4, 2), ["a", "a", "b", "b"]
    )
    torch.testing.assert_close(adv, same)


def test_rloo_leave_one_out() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 2.0], dtype=D)
    adv, _ = compute_advantages(cfg("rloo"), r, torch.ones(4, 1), ["g", "g", "g", "solo"])
    # 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice); a group of one has no baseline: 0
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -0.5, -0.5, 0.0], dtype=D))


def test_reinforce_batch_running_and_no_baseline() -> None:
    mask = torch.ones(2, 1)
    ids = ["x", "y"]
    r1 = torch.tensor([1.0, 0.0], dtype=D)
    adv, _ = compute_advantages(cfg("reinforce"), r1, mask, ids)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5], dtype=D))
    adv, _ = compute_advantages(cfg("reinforce", baseline="none"), r1, mask, ids)
    torch.testing.assert_close(adv[:, 0], r1)

    running = cfg("reinforce", baseline="running")
    base = RunningBaseline(decay=0.9)
    adv, _ = compute_advantages(running, r1, mask, ids, baseline=base)  # first batch: its mean
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5], dtype=D))
    assert base.value == pytest.approx(0.5)
    adv, _ = compute_advantages(
        running, torch.tensor([1.0, 1.0], dtype=D), mask, ids, baseline=base
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, 0.5], dtype=D))  # baseline before
    assert base.value == pytest.approx(0.9 * 0.5 + 0.1 * 1.0)
    restored = RunningBaseline()
    restored.load_state_dict(base.state_dict())
    assert (restored.value, restored.count, restored.decay) == (base.value, 2, 0.9)
    with pytest.raises(ValueError, match="RunningBaseline"):
        compute_advantages(running, r1, mask, ids)


def test_gae_hand_numbers() -> None:
    values = torch.tensor([[0.5, 0.6, 0.7]], dtype=D)
    mask = torch.ones(1, 3)
    r = torch.tensor([1.0], dtype=D)
    adv, ret = compute_advantages(
        cfg("ppo", whiten_advantages=False, lam=1.0), r, mask, ["a"], values
    )
    # deltas 0.1, 0.1, 0.3 -> A = 0.5, 0.4, 0.3; returns = A + V = 1, 1, 1
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.3]], dtype=D))
    assert ret is not None
    torch.testing.assert_close(ret, torch.ones(1, 3, dtype=D))
    c = cfg("ppo", whiten_advantages=False, gamma=0.9, lam=0.5)
    adv, _ = compute_advantages(c, r, mask, ["a"], values)
    # deltas 0.04, 0.03, 0.3; A2 = 0.3, A1 = 0.03 + 0.45 * 0.3, A0 = 0.04 + 0.45 * A1
    a1 = 0.03 + 0.45 * 0.3
    torch.testing.assert_close(adv, torch.tensor([[0.04 + 0.45 * a1, a1, 0.3]], dtype=D))


def test_gae_skips_tool_tokens_in_a_multi_turn_row() -> None:
    """Tool tokens are not time steps: GAE over positions 0, 1, 4 equals GAE over 3 steps."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    values = torch.tensor([[0.5, 0.6, 99.0, -99.0, 0.7, 42.0]], dtype=D)
    c = cfg("ppo", whiten_advantages=False)
    adv, ret = compute_advantages(c, torch.tensor([1.0], dtype=D), mask, ["a"], values)
    compact, _ = compute_advantages(
        c, torch.tensor([1.0], dtype=D), torch.ones(1, 3), ["a"], values[:, [0, 1, 4]]
    )
    assert adv[0, [2, 3, 5]].eq(0).all()
    assert ret is not None and ret[0, [2, 3, 5]].eq(0).all()
    torch.testing.assert_close(adv[0, [0, 1, 4]], compact[0])


def test_token_rewards_on_tool_tokens_go_to_the_action_before() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0]])
    rewards = torch.tensor([[0.25, 0.0, 0.0, 1.0, 2.0, 0.0, 4.0]])
    spread = spread_token_rewards(rewards, mask)
    torch.testing.assert_close(spread, torch.tensor([[0, 0.25, 3.0, 0, 0, 4.0, 0]]))
    seq = spread_token_rewards(torch.tensor([5.0, 7.0]), torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0]]))
    torch.testing.assert_close(seq, torch.tensor([[0, 0, 5.0, 0], [0, 0, 0, 0]]))


def test_reinforce_pp_returns_whitened_over_the_batch() -> None:
    mask = torch.tensor([[1, 1], [1, 0]])
    adv, _ = compute_advantages(cfg("reinforce_pp"), torch.tensor([1.0, 0.0], dtype=D), mask, "ab")
    # returns 1, 1, 0: mean 2/3, unbiased var 1/3
    s = math.sqrt(1 / 3 + 1e-6)
    expected = torch.tensor([[1 / 3 / s, 1 / 3 / s], [-2 / 3 / s, 0]], dtype=D)
    torch.testing.assert_close(adv, expected)


def test_kl_penalty_folded_into_token_rewards() -> None:
    c = cfg("ppo", whiten_advantages=False, lam=1.0, kl_coef=0.1, kl_estimator="k1")
    mask = torch.ones(1, 3)
    old = torch.tensor([[-1.0, -1.0, -1.0]], dtype=D)
    ref = torch.tensor([[-1.5, -1.0, -0.5]], dtype=D)
    adv, _ = compute_advantages(
        c, torch.tensor([1.0], dtype=D), mask, ["a"], torch.zeros(1, 3, dtype=D),
        behavior_logprobs=old, ref_logprobs=ref,
    )  # fmt: skip
    # k1 = [0.5, 0, -0.5] -> rewards [-0.05, 0, 1 + 0.05]; reward-to-go with V = 0
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.05, 1.05]], dtype=D))
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_advantages(c, torch.tensor([1.0]), mask, ["a"], torch.zeros(1, 3))


def test_row_without_policy_tokens_still_counts_in_its_group() -> None:
    mask = torch.tensor([[1, 1], [0, 0]])
    adv, _ = compute_advantages(cfg("dr_grpo"), torch.tensor([1.0, 0.0]), mask, ["g", "g"])
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [0.0, 0.0]]))


def test_unknown_estimator_and_missing_values() -> None:
    with pytest.raises(ConfigError, match="did you mean 'rloo'"):
        get_advantage_estimator("rlooo")
    with pytest.raises(ValueError, match="values"):
        compute_advantages(cfg("ppo"), torch.ones(1), torch.ones(1, 2), ["a"])
    with pytest.raises(ValueError, match="group ids"):
        compute_advantages(cfg("grpo"), torch.ones(2), torch.ones(2, 2), ["a"])


def test_masked_statistics() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1, 1, 1, 0])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    assert masked_var(x, m).item() == pytest.approx(1.0)
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    w = masked_whiten(x, m)
    assert w[3].item() == 0.0 and w[:3].sum().abs().item() < 1e-6
    assert masked_mean(x, torch.zeros(4)).item() == 0.0  # empty mask: 0, not NaN


# --- independent reference on random inputs -----------------------------------------------------


def random_mask(rng: random.Random, B: int, T: int) -> torch.Tensor:
    """Right-padded rows with tool-token holes; some rows empty."""
    rows = []
    for b in range(B):
        n = 0 if b == 1 else rng.randint(1, T)
        row = [1 if rng.random() < 0.7 else 0 for _ in range(n)] + [0] * (T - n)
        if n and not any(row):
            row[0] = 1
        rows.append(row)
    return torch.tensor(rows)


def ref_gae(r: list[float], v: list[list[float]], m: list[list[int]], g: float, lam: float):
    adv, ret = [], []
    for b, row in enumerate(m):
        pos = [t for t, x in enumerate(row) if x]
        a_row = [0.0] * len(row)
        last = 0.0
        for k in reversed(range(len(pos))):
            t = pos[k]
            nv = v[b][pos[k + 1]] if k + 1 < len(pos) else 0.0
            rew = r[b] if k == len(pos) - 1 else 0.0
            last = rew + g * nv - v[b][t] + g * lam * last
            a_row[t] = last
        adv.append(a_row)
        ret.append([a_row[t] + v[b][t] if row[t] else 0.0 for t in range(len(row))])
    return adv, ret


def ref_group(r: list[float], ids: list[str], kind: str, scale: bool, eps: float) -> list[float]:
    out = []
    for i, gi in enumerate(ids):
        grp = [r[j] for j, gj in enumerate(ids) if gj == gi]
        mean = sum(grp) / len(grp)
        if kind == "rloo":
            out.append(0.0 if len(grp) == 1 else r[i] - (sum(grp) - r[i]) / (len(grp) - 1))
            continue
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (len(grp) - 1)) if len(grp) > 1 else 0
        out.append((r[i] - mean) / (std + eps) if scale else r[i] - mean)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_estimators_match_loop_reference(seed: int) -> None:
    rng = random.Random(seed)
    B, T = 8, 11
    mask = random_mask(rng, B, T)
    ids = [rng.choice("abc") for _ in range(B)]
    r = [rng.choice([0.0, 1.0, rng.uniform(-3, 3)]) for _ in range(B)]
    v = [[rng.uniform(-2, 2) for _ in range(T)] for _ in range(B)]
    rt, vt, m = torch.tensor(r, dtype=D), torch.tensor(v, dtype=D), mask.tolist()
    gamma, lam = rng.uniform(0.8, 1.0), rng.uniform(0.5, 1.0)

    c = cfg("ppo", whiten_advantages=False, gamma=gamma, lam=lam)
    adv, ret = compute_advantages(c, rt, mask, ids, vt)
    ea, er = ref_gae(r, v, m, gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(ea, dtype=D), rtol=0, atol=1e-6)
    assert ret is not None
    torch.testing.assert_close(ret, torch.tensor(er, dtype=D), rtol=0, atol=1e-6)

    for name, kind, scale in (
        ("grpo", "grpo", True),
        ("dr_grpo", "grpo", False),
        ("rloo", "rloo", False),
    ):
        adv, _ = compute_advantages(cfg(name), rt, mask, ids)
        seq = ref_group(r, ids, kind, scale, 1e-6)
        expected = [[seq[b] if m[b][t] else 0.0 for t in range(T)] for b in range(B)]
        torch.testing.assert_close(adv, torch.tensor(expected, dtype=D), rtol=0, atol=1e-6)

    # REINFORCE++: reward-to-go over policy tokens, then whitened over all policy tokens
    c = cfg("reinforce_pp", gamma=gamma)
    adv, _ = compute_advantages(c, rt, mask, ids)
    G = [[0.0] * T for _ in range(B)]
    for b in range(B):
        pos = [t for t in range(T) if m[b][t]]
        for k, t in enumerate(pos):
            G[b][t] = r[b] * gamma ** (len(pos) - 1 - k)
    flat = [G[b][t] for b in range(B) for t in range(T) if m[b][t]]
    mu = sum(flat) / len(flat)
    var = sum((x - mu) ** 2 for x in flat) / (len(flat) - 1)
    expected = [[(G[b][t] - mu) / math.sqrt(var + 1e-6) if m[b][t] else 0.0 for t in range(T)]
                for b in range(B)]  # fmt: skip
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=D), rtol=0, atol=1e-6)


def test_advantages_exactly_zero_off_mask_and_blind_to_values_there() -> None:
    rng = random.Random(7)
    mask = random_mask(rng, 6, 9)
    r = torch.randn(6, dtype=D)
    v = torch.randn(6, 9, dtype=D)
    v2 = torch.where(mask.bool(), v, torch.full_like(v, 1e6))
    for name in ("ppo", "grpo", "dr_grpo", "rloo", "reinforce", "reinforce_pp"):
        c = AlgoConfig.from_name(name)
        vals = v if c.needs().critic else None
        adv, _ = compute_advantages(c, r, mask, "aabbcc", vals)
        assert adv[~mask.bool()].eq(0).all(), name
        if vals is not None:
            adv2, _ = compute_advantages(c, r, mask, "aabbcc", v2)
            torch.testing.assert_close(adv, adv2, rtol=0, atol=0)


@pytest.mark.parametrize(
    "group_ids",
    [
        [0, 0, 1, 1],
        torch.tensor([0, 0, 1, 1]),
        list(torch.tensor([0, 0, 1, 1])),  # 0-d tensors hash by identity: compared by value
        ["a", "a", "b", "b"],
    ],
    ids=["ints", "tensor", "list-of-0d-tensors", "strings"],
)
def test_group_ids_may_be_a_tensor_and_are_compared_by_value(group_ids: object) -> None:
    cfg = AlgoConfig.from_name("grpo")
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv, _ = compute_advantages(cfg, rewards, torch.ones(4, 2), group_ids)  # type: ignore[arg-type]
    # task 0: rewards 1 and 0 -> +-1/sqrt(2) (unbiased std); task 1: both 1 -> 0
    assert adv[:, 0].tolist() == pytest.approx([2**-0.5, -(2**-0.5), 0.0, 0.0], abs=1e-4)


def test_group_ids_of_another_shape_are_refused() -> None:
    cfg = AlgoConfig.from_name("grpo")
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages(cfg, torch.ones(4), torch.ones(4, 2), torch.zeros(4, 2))
