"""Policy/value losses: hand numbers, gradient checks, masking, and a loop reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from areal_agents.errors import ConfigError
from areal_agents.trainers.algorithms import AlgoConfig, compute_policy_loss, compute_value_loss
from areal_agents.trainers.losses import aggregate, aggregation_normalizer, get_loss, kl_estimate

D = torch.float64


def cfg(**kw: object) -> AlgoConfig:
    return AlgoConfig().replace(**kw)


def per_token(c: AlgoConfig, ratio: list[float], adv: list[float], behav_shift: float = 0.0):
    """Per-token loss and d(loss)/d(logprob) for given ratios pi/pi_prox and advantages."""
    prox = torch.full((1, len(ratio)), -1.0, dtype=D)
    lp = (prox + torch.tensor([ratio], dtype=D).log()).requires_grad_(True)
    behav = prox - behav_shift
    a = torch.tensor([adv], dtype=D)
    loss, metrics = get_loss(c.loss)(c, lp, prox, behav, a, torch.ones_like(a))
    loss.sum().backward()
    assert lp.grad is not None
    return loss.detach()[0].tolist(), lp.grad[0].tolist(), metrics


def test_ppo_clip_values_and_zero_gradient_exactly_where_clipped() -> None:
    c = cfg(loss="ppo_clip", clip_eps_low=0.2, clip_eps_high=0.2)
    ratio = [1.5, 0.5, 0.5, 1.5, 1.0]
    adv = [1.0, 1.0, -1.0, -1.0, 2.0]
    loss, grad, metrics = per_token(c, ratio, adv)
    # A>0, r>1.2: clipped at 1.2, no gradient (stop pushing a good token up)
    # A>0, r<0.8: unclipped (min picks r A), gradient -A r
    # A<0, r<0.8: clipped at 0.8, no gradient (stop pushing a bad token down)
    # A<0, r>1.2: unclipped, gradient -A r = +1.5
    assert loss == pytest.approx([-1.2, -0.5, 0.8, 1.5, -2.0])
    assert grad == pytest.approx([0.0, -0.5, 0.0, 1.5, -2.0])
    assert grad[0] == 0.0 and grad[2] == 0.0  # exactly
    assert metrics["clip/high_frac"].item() == pytest.approx(1 / 5)
    assert metrics["clip/low_frac"].item() == pytest.approx(1 / 5)
    assert metrics["clip/frac"].item() == pytest.approx(2 / 5)
    assert metrics["ratio/max"].item() == pytest.approx(1.5)
    assert metrics["ratio/min"].item() == pytest.approx(0.5)


def test_clip_higher_is_asymmetric() -> None:
    c = cfg(clip_eps_low=0.2, clip_eps_high=0.28)
    loss, grad, _ = per_token(c, [1.25, 1.3, 0.79, 0.81], [1.0, 1.0, -1.0, -1.0])
    assert loss == pytest.approx([-1.25, -1.28, 0.8, 0.81])
    assert grad == pytest.approx([-1.25, 0.0, 0.0, 0.81])


def test_dual_clip_bounds_negative_advantage_tokens() -> None:
    c = cfg(dual_clip_c=3.0)
    loss, grad, metrics = per_token(c, [4.0, 2.0, 4.0], [-1.0, -1.0, 1.0])
    # A<0, r=4 > c: loss -c A = 3 and no gradient; r=2 < c: the usual r|A|; A>0 unaffected
    assert loss == pytest.approx([3.0, 2.0, -1.2])
    assert grad == pytest.approx([0.0, 2.0, 0.0])
    assert metrics["clip/dual_frac"].item() == pytest.approx(1 / 3)


def test_decoupled_weights_truncated_or_masked() -> None:
    c = cfg(loss="decoupled_ppo", behavior_imp_cap=5.0, behavior_imp_mode="truncate")
    # prox / behav = 10 > cap: truncated to 5, so loss and gradient scale by 5
    loss, grad, m = per_token(c, [1.0, 0.5], [1.0, 1.0], behav_shift=math.log(10))
    assert loss == pytest.approx([-5.0, -2.5])
    assert grad == pytest.approx([-5.0, -2.5])
    assert m["behavior/weight/max"].item() == pytest.approx(10.0)
    assert m["behavior/capped_frac"].item() == pytest.approx(1.0)
    loss, grad, _ = per_token(c.replace(behavior_imp_mode="mask"), [1.0], [1.0], math.log(10))
    assert loss == [0.0] and grad == [0.0]
    loss, grad, _ = per_token(c, [1.0], [1.0], behav_shift=math.log(2))  # under the cap
    assert loss == pytest.approx([-2.0]) and grad == pytest.approx([-2.0])
    # ppo_clip ignores the behaviour policy (it only reports it)
    loss, _, m = per_token(c.replace(loss="ppo_clip"), [1.0], [1.0], math.log(10))
    assert loss == pytest.approx([-1.0]) and m["behavior/weight/mean"].item() == pytest.approx(10)


def test_reinforce_is_minus_advantage_times_logprob() -> None:
    c = cfg(loss="reinforce")
    loss, grad, _ = per_token(c, [1.0, 3.0], [2.0, -0.5])
    assert loss == pytest.approx([2.0, 0.5 * (-1.0 + math.log(3.0))])
    assert grad == pytest.approx([-2.0, 0.5])


def test_kl_estimators_hand_numbers_and_gradients() -> None:
    d = math.log(2.0)
    lp = torch.tensor([d], dtype=D, requires_grad=True)
    ref = torch.zeros(1, dtype=D)
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(d)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(d * d / 2)
    k3 = kl_estimate(lp, ref, "k3")
    assert k3.item() == pytest.approx(0.5 - 1 + d)
    k3.backward()
    assert lp.grad is not None and lp.grad.item() == pytest.approx(1 - 0.5)  # 1 - exp(-d)
    assert kl_estimate(ref, ref, "k3").item() == 0.0
    with pytest.raises(ConfigError, match="k3"):
        kl_estimate(lp, ref, "k4")


def test_aggregations_hand_numbers_and_normalizer() -> None:
    x = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert aggregate(x, m, "token_mean").item() == pytest.approx(3.0)
    assert aggregate(x, m, "seq_mean_token_mean").item() == pytest.approx(3.5)  # empty row out
    # without norm_tokens: B x the most policy tokens a row holds (2), never the padded width
    assert aggregate(x, m, "seq_sum_norm").item() == pytest.approx(9 / 6)
    assert aggregate(x, m, "seq_sum_norm", norm_tokens=6).item() == pytest.approx(9 / 18)
    # micro-batches with the global normaliser sum to the full-batch value
    parts = aggregate(x[:1], m[:1], "token_mean", normalizer=3) + aggregate(
        x[1:], m[1:], "token_mean", normalizer=3
    )
    assert parts.item() == pytest.approx(3.0)
    with pytest.raises(ConfigError, match="did you mean 'token_mean'"):
        aggregate(x, m, "token_meen")


def test_dr_grpo_normaliser_ignores_prompt_tokens() -> None:
    """The same policy tokens behind a longer prompt (or padded wider) keep Dr. GRPO's
    denominator: it used to be B x T, T counting prompt and padding positions."""
    short = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]])
    long = torch.cat([torch.zeros(2, 40, dtype=torch.long), short], dim=1)  # 40 prompt tokens
    for norm_tokens in (None, 80):
        a = aggregation_normalizer(short, "seq_sum_norm", norm_tokens=norm_tokens)
        b = aggregation_normalizer(long, "seq_sum_norm", norm_tokens=norm_tokens)
        assert float(a) == float(b)
    assert float(aggregation_normalizer(long, "seq_sum_norm")) == 2 * 3


def test_value_loss_clipping_hand_numbers() -> None:
    c = cfg(advantage="gae", vf_clip=0.2, vf_coef=0.5)
    v = torch.tensor([[1.5, 1.1, 3.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.0]], dtype=D)
    ret = torch.tensor([[2.0, 2.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = compute_value_loss(c, v, old, ret, mask)
    # token 0: V_clip = 1.2 -> 0.5 * max(0.25, 0.64) = 0.32, gradient 0 (clip saturated)
    # token 1: inside the clip range -> 0.5 * 0.81, gradient V - R = -0.9
    assert loss.item() == pytest.approx(0.5 * (0.32 + 0.405) / 2)
    loss.backward()
    assert v.grad is not None
    assert v.grad[0].tolist() == pytest.approx([0.0, 0.5 * -0.9 / 2, 0.0])
    assert metrics["value/clip_frac"].item() == pytest.approx(0.5)
    assert metrics["loss/value"].item() == pytest.approx((0.32 + 0.405) / 2)
    unclipped, _ = compute_value_loss(c.replace(vf_clip=None), v, old, ret, mask)
    assert unclipped.item() == pytest.approx(0.5 * (0.125 + 0.405) / 2)


# --- independent reference on random inputs, extreme ratios included -----------------------------


def ref_token(lp: float, prox: float, behav: float, a: float, c: AlgoConfig) -> tuple[float, float]:
    """Loss and d(loss)/d(lp) of one token, written out case by case."""
    lim = c.max_log_ratio
    d = max(-lim, min(lim, lp - prox))
    dgrad = 1.0 if -lim < lp - prox < lim else 0.0
    r = math.exp(d)
    lo, hi = 1 - c.clip_eps_low, 1 + c.clip_eps_high
    rc = min(max(r, lo), hi)
    unclipped, clipped = -a * r, -a * rc
    if c.loss == "reinforce":  # no ratio: -A log pi, behaviour-weighted below
        loss, grad = -a * lp, -a
    elif unclipped >= clipped:
        loss, grad = unclipped, -a * r * dgrad
    else:
        loss, grad = clipped, (-a * r * dgrad if lo < r < hi else 0.0)
    if c.loss != "reinforce" and c.dual_clip_c is not None and a < 0 and -c.dual_clip_c * a < loss:
        loss, grad = -c.dual_clip_c * a, 0.0
    if c.loss in ("decoupled_ppo", "reinforce"):
        w = math.exp(max(-20, min(20, prox - behav)))
        cap = c.behavior_imp_cap
        if cap is not None and w > cap:
            w = cap if c.behavior_imp_mode == "truncate" else 0.0
        loss, grad = w * loss, w * grad
    return loss, grad


def ref_aggregate(x: list[list[float]], m: list[list[int]], mode: str, L: int) -> float:
    pairs = list(zip(x, m, strict=True))
    total = sum(v for xr, mr in pairs for v, k in zip(xr, mr, strict=True) if k)
    if mode == "token_mean":
        return total / max(sum(map(sum, m)), 1)
    if mode == "seq_sum_norm":
        return total / (len(x) * L)
    rows = [
        sum(v for v, k in zip(xr, mr, strict=True) if k) / sum(mr) for xr, mr in pairs if sum(mr)
    ]
    return sum(rows) / max(len(rows), 1)


CASES = [
    dict(loss="ppo_clip"),
    dict(loss="ppo_clip", clip_eps_high=0.28, dual_clip_c=3.0, aggregation="seq_mean_token_mean"),
    dict(loss="decoupled_ppo", aggregation="seq_sum_norm", norm_tokens=16),
    dict(loss="decoupled_ppo", behavior_imp_mode="mask", behavior_imp_cap=2.0, dual_clip_c=2.0),
    dict(loss="reinforce", aggregation="seq_mean_token_mean"),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("seed", range(3))
def test_policy_loss_matches_loop_reference(case: dict[str, object], seed: int) -> None:
    c = cfg(**case)
    rng = random.Random(seed)
    B, T = 6, 10
    m = [[0] * T for _ in range(B)]
    for b in range(B):
        n = 0 if b == 2 else rng.randint(1, T)
        for t in range(n):
            m[b][t] = 1 if rng.random() < 0.75 else 0  # ragged: tool tokens inside
        m[b][0] = 1 if n else 0
    # log-ratios from tiny to extreme (|lp - prox| up to 40, past the ±20 clamp)
    spread = [0.05, 0.3, 2.0, 40.0]
    prox = [[rng.uniform(-8, 0) for _ in range(T)] for _ in range(B)]
    lp = [
        [p + rng.choice([-1, 1]) * rng.uniform(0, rng.choice(spread)) for p in row] for row in prox
    ]
    behav = [[p + rng.uniform(-3, 3) for p in row] for row in prox]
    adv = [[rng.uniform(-2, 2) for _ in range(T)] for _ in range(B)]

    lp_t = torch.tensor(lp, dtype=D, requires_grad=True)
    mask = torch.tensor(m)
    loss, metrics = compute_policy_loss(
        c, lp_t, torch.tensor(prox, dtype=D), torch.tensor(behav, dtype=D),
        torch.tensor(adv, dtype=D), mask,
    )  # fmt: skip
    loss.backward()

    tok = [[ref_token(lp[b][t], prox[b][t], behav[b][t], adv[b][t], c) for t in range(T)]
           for b in range(B)]  # fmt: skip
    L = c.norm_tokens or T
    expected = ref_aggregate([[x[0] for x in row] for row in tok], m, c.aggregation, L)
    assert abs(loss.item() - expected) <= 1e-6 * max(1.0, abs(expected))
    # gradient: the per-token reference gradient times d(aggregate)/d(token)
    weight = [[0.0] * T for _ in range(B)]
    n_tok = sum(map(sum, m))
    rows = sum(1 for row in m if sum(row))
    for b in range(B):
        for t in range(T):
            if not m[b][t]:
                continue
            if c.aggregation == "token_mean":
                weight[b][t] = 1 / n_tok
            elif c.aggregation == "seq_sum_norm":
                weight[b][t] = 1 / (B * L)
            else:
                weight[b][t] = 1 / (sum(m[b]) * rows)
    expected_grad = [[tok[b][t][1] * weight[b][t] for t in range(T)] for b in range(B)]
    assert lp_t.grad is not None
    torch.testing.assert_close(
        lp_t.grad, torch.tensor(expected_grad, dtype=D), rtol=1e-6, atol=1e-6
    )
    assert all(torch.isfinite(v).all() for v in metrics.values())
    assert all(not v.requires_grad for v in metrics.values())


def test_masked_tokens_contribute_exactly_nothing() -> None:
    torch.manual_seed(0)
    B, T = 4, 7
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 0], [1] * 7, [0] * 7, [0, 1, 1, 1, 0, 1, 0]])
    off = ~mask.bool()
    lp = torch.randn(B, T, dtype=D) - 2
    prox, behav, ref = lp - 0.1 * torch.randn(B, T), lp - 0.2, lp + 0.3
    adv, ent = torch.randn(B, T, dtype=D), torch.rand(B, T, dtype=D)

    def garbage(x: torch.Tensor, value: float) -> torch.Tensor:
        return torch.where(off, torch.full_like(x, value), x)

    for loss_name in ("ppo_clip", "decoupled_ppo", "reinforce"):
        for agg in ("token_mean", "seq_mean_token_mean", "seq_sum_norm"):
            c = cfg(loss=loss_name, aggregation=agg, kl_coef=0.1, entropy_coef=0.01)
            a = lp.clone().requires_grad_(True)
            clean, m1 = compute_policy_loss(c, a, prox, behav, adv, mask, ref, ent)
            clean.backward()
            b = garbage(lp, float("nan")).requires_grad_(True)
            dirty, m2 = compute_policy_loss(
                c, b, garbage(prox, float("inf")), garbage(behav, -1e30),
                garbage(adv, 1e30), mask, garbage(ref, float("nan")), garbage(ent, 1e9),
            )  # fmt: skip
            dirty.backward()
            assert torch.equal(clean, dirty), (loss_name, agg)
            assert a.grad is not None and b.grad is not None
            assert torch.equal(a.grad, b.grad)
            assert b.grad[off].eq(0).all()
            for k in m1:
                assert torch.equal(m1[k], m2[k]), k


def _naive_and_decoupled(behav_shift: float, proximal_shift: float | None):
    """Loss and gradient of ppo_clip and decoupled_ppo through ``compute_policy_loss``.

    One token, A = 1, current log-prob -1, the sampler's ``-1 - behav_shift``. Each loss gets
    the proximal policy a learner gives it: ppo_clip declares the sampler (None: nothing is
    recomputed); decoupled_ppo the step-start weights: the current ones with one update per step
    (``proximal_shift=None``), else the recomputed log-prob ``-1 - proximal_shift``."""
    out = {}
    for name in ("ppo_clip", "decoupled_ppo"):
        lp = torch.tensor([[-1.0]], dtype=D, requires_grad=True)
        behav = torch.tensor([[-1.0 - behav_shift]], dtype=D)
        prox = None
        if name == "decoupled_ppo" and proximal_shift is not None:
            prox = torch.tensor([[-1.0 - proximal_shift]], dtype=D)
        a, m = torch.ones(1, 1, dtype=D), torch.ones(1, 1, dtype=D)
        loss, _ = compute_policy_loss(cfg(loss=name), lp, prox, behav, a, m)
        loss.backward()
        assert lp.grad is not None
        out[name] = (loss.item(), lp.grad.item())
    return out


def test_naive_and_decoupled_differ_exactly_when_proximal_and_behaviour_differ() -> None:
    # fresh data: the sampler is the proximal (current) policy -> the same loss, the same grad
    same = _naive_and_decoupled(behav_shift=0.0, proximal_shift=None)
    assert same["ppo_clip"] == pytest.approx((-1.0, -1.0))
    assert same["decoupled_ppo"] == pytest.approx((-1.0, -1.0))
    # stale data, pi_prox / pi_behav = 2: naive clips r = pi / pi_behav = 2 at 1.2 (no gradient);
    # decoupled has r = pi / pi_prox = 1 and weighs the token by w = 2
    stale = _naive_and_decoupled(behav_shift=math.log(2.0), proximal_shift=None)
    assert stale["ppo_clip"] == pytest.approx((-1.2, 0.0))
    assert stale["decoupled_ppo"] == pytest.approx((-2.0, -2.0))
    # a later update of a step (the weights moved: pi / pi_prox = 1.1), step-start = sampler:
    # identical again, both r = 1.1 inside the clip range
    eq = _naive_and_decoupled(behav_shift=math.log(1.1), proximal_shift=math.log(1.1))
    assert eq["ppo_clip"] == pytest.approx((-1.1, -1.1))
    assert eq["decoupled_ppo"] == pytest.approx((-1.1, -1.1))
    # ... and a stale sampler, pi_prox / pi_behav = 1.5: naive r = 1.65 is clipped at 1.2;
    # decoupled keeps r = 1.1 and weighs by 1.5
    diff = _naive_and_decoupled(behav_shift=math.log(1.65), proximal_shift=math.log(1.1))
    assert diff["ppo_clip"] == pytest.approx((-1.2, 0.0))
    assert diff["decoupled_ppo"] == pytest.approx((-1.65, -1.65))


def test_auto_loss_is_decoupled_in_async_and_ppo_clip_in_sync() -> None:
    grpo = AlgoConfig.from_name("grpo")
    assert grpo.loss == "auto"
    assert grpo.for_mode("async").loss == "decoupled_ppo"
    assert grpo.for_mode("sync").loss == "ppo_clip"
    assert grpo.replace(loss="ppo_clip").for_mode("async").loss == "ppo_clip"  # an explicit choice
    assert AlgoConfig.from_name("reinforce").for_mode("async").loss == "reinforce"
    assert get_loss("auto").name == "ppo_clip"  # no mode known
    # the proximal pass follows the resolved loss
    assert grpo.for_mode("async").needs(updates_per_step=2).proximal_pass
    assert not grpo.for_mode("sync").needs(updates_per_step=2).proximal_pass


def test_kl_rows_no_signal_puts_the_kl_only_on_rows_without_an_advantage() -> None:
    """``kl_rows=no_signal``: a row whose advantage is 0 on every policy token gets the KL's
    gradient and nothing else; a row with an advantage gets the policy gradient and no KL."""
    lp0 = torch.full((3, 4), -1.0, dtype=D)
    adv = torch.tensor([[0.5] * 4, [0.0] * 4, [0.0, 0.0, -0.5, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1]], dtype=D)
    ref = lp0 + math.log(2.0)  # d = log(1/2) on every token: k3 = 2 - 1 - log 2

    def grads(**kw: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        lp = lp0.clone().requires_grad_(True)
        c = cfg(loss="ppo_clip", **kw)
        loss, metrics = compute_policy_loss(c, lp, lp0, lp0, adv, mask, ref)
        loss.backward()
        assert lp.grad is not None
        return lp.grad, metrics

    pg, _ = grads()
    everywhere, m_all = grads(kl_coef=1.0)
    anchored, m_some = grads(kl_coef=1.0, kl_rows="no_signal")
    kl_grad = everywhere - pg  # d/dlp of k3 = 1 - exp(-d) = -1, over the 10 policy tokens
    assert kl_grad[mask.bool()] == pytest.approx(torch.full((10,), -0.1, dtype=D))
    # row 1 has no advantage: KL only; rows 0 and 2 have one: the policy gradient only
    assert anchored[1].tolist() == pytest.approx(everywhere[1].tolist())
    assert anchored[[0, 2]].flatten().tolist() == pytest.approx(pg[[0, 2]].flatten().tolist())
    assert anchored[1, :3].abs().min() > 0  # the anchor does act there
    k3 = 2 - 1 - math.log(2.0)
    assert m_all["loss/kl"].item() == pytest.approx(k3)
    assert m_some["loss/kl"].item() == pytest.approx(k3 * 3 / 10)  # 3 of the 10 tokens
    assert m_some["kl/anchored_frac"].item() == pytest.approx(3 / 10)
    assert m_some["kl_ref"].item() == pytest.approx(k3)  # still measured on every row
    for bad in ({"kl_rows": "no_signal"}, {"kl_rows": "no_signal", "kl_in_reward": True}):
        with pytest.raises(ConfigError, match="kl_rows"):
            cfg(kl_coef=0.1 if "kl_in_reward" in bad else 0.0, **bad)
    with pytest.raises(ConfigError, match="kl_rows"):
        cfg(kl_coef=0.1, kl_rows="some")
