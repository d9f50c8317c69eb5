"""The off-policy corrections (``trainers/corrections.py``) against their formulas, worked out
in plain Python on random inputs; the behaviour KL against the exact KL of known distributions."""

from __future__ import annotations

import math
import random

import pytest
import torch

from areal_agents.trainers.batching import token_staleness
from areal_agents.trainers.corrections import (
    behavior_kl,
    behavior_weights,
    segment_ids,
    unit_log_ratio,
    weight_summary,
)


def _turns(mask_row: list[int]) -> list[list[int]]:
    """The positions of each run of 1s."""
    out: list[list[int]] = []
    for t, m in enumerate(mask_row):
        if m and (t == 0 or not mask_row[t - 1]):
            out.append([])
        if m:
            out[-1].append(t)
    return out


def reference_weights(
    log_w: list[list[float]],
    mask: list[list[int]],
    *,
    cap: float | None,
    mode: str,
    level: str,
    agg: str,
    floor: float | None,
) -> list[list[float]]:
    """The corrected weight of every token, unit by unit, as the docstring defines it."""
    out = [[0.0] * len(row) for row in log_w]
    for b, row in enumerate(mask):
        if level == "token":
            units = [[t] for t, m in enumerate(row) if m]
        elif level == "turn":
            units = _turns(row)
        else:
            units = [[t for t, m in enumerate(row) if m]] if any(row) else []
        for unit in units:
            logs = [max(-20.0, min(20.0, log_w[b][t])) for t in unit]
            s = sum(logs) / len(logs) if agg == "geometric" and level != "token" else sum(logs)
            w = math.exp(max(-20.0, min(20.0, s)))
            if floor is not None and w < floor:
                w = 0.0
            elif cap is not None and w > cap:
                w = cap if mode == "truncate" else 0.0
            for t in unit:
                out[b][t] = w
    return out


CASES = [
    dict(cap=5.0, mode="truncate", level="token", agg="geometric", floor=None),  # TIS
    dict(cap=2.0, mode="mask", level="token", agg="geometric", floor=None),  # AReaL's cap
    dict(cap=2.0, mode="mask", level="token", agg="geometric", floor=0.5),
    dict(cap=1.5, mode="mask", level="turn", agg="geometric", floor=None),  # turn MIS
    dict(cap=3.0, mode="truncate", level="turn", agg="product", floor=None),
    dict(cap=1.5, mode="mask", level="sequence", agg="geometric", floor=0.7),  # geo-mean MIS
    dict(cap=4.0, mode="mask", level="sequence", agg="product", floor=None),  # sequence MIS
    dict(cap=None, mode="truncate", level="sequence", agg="product", floor=None),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("seed", range(3))
def test_behavior_weights_match_their_formula(case: dict[str, object], seed: int) -> None:
    rng = random.Random(seed)
    B, T = 5, 12
    mask = [[1 if rng.random() < 0.6 else 0 for _ in range(T)] for _ in range(B)]
    mask[1] = [0] * T  # a row without policy tokens
    log_w = [[rng.choice([0.05, 0.5, 2.0, 30.0]) * rng.uniform(-1, 1) for _ in range(T)]
             for _ in range(B)]  # fmt: skip
    behav = torch.tensor(
        [[rng.uniform(-6, 0) for _ in range(T)] for _ in range(B)], dtype=torch.float64
    )
    prox = behav + torch.tensor(log_w, dtype=torch.float64)
    w, metrics = behavior_weights(prox, behav, torch.tensor(mask, dtype=torch.float64), **case)  # type: ignore[arg-type]
    expected = reference_weights(log_w, mask, **case)  # type: ignore[arg-type]
    for b in range(B):
        for t in range(T):
            if mask[b][t]:
                assert w[b, t].item() == pytest.approx(expected[b][t], rel=1e-9, abs=1e-12)
    # the metrics count what the correction did
    on = [(b, t) for b in range(B) for t in range(T) if mask[b][t]]
    raw = [math.exp(max(-20.0, min(20.0, log_w[b][t]))) for b, t in on]
    untouched = reference_weights(log_w, mask, **{**case, "cap": None, "floor": None})  # type: ignore[arg-type]
    changed = [expected[b][t] != untouched[b][t] for b, t in on]
    zeroed = [expected[b][t] == 0.0 for b, t in on]
    assert metrics["behavior/capped_frac"].item() == pytest.approx(sum(changed) / len(on))
    assert metrics["behavior/masked_frac"].item() == pytest.approx(sum(zeroed) / len(on))
    assert metrics["behavior/weight/max"].item() == pytest.approx(max(raw))
    masked_rows = {b for (b, t), z in zip(on, zeroed, strict=True) if z}
    assert metrics["behavior/masked_seqs"].item() == len(masked_rows)


def test_segment_ids_and_unit_ratios_by_hand() -> None:
    mask = torch.tensor([[0.0, 1, 1, 0, 1, 1, 1, 0]])
    assert segment_ids(mask).tolist() == [[-1, 0, 0, 0, 1, 1, 1, 1]]
    lr = torch.tensor([[9.0, 1.0, 3.0, 9.0, 0.0, 3.0, 6.0, 9.0]])
    assert unit_log_ratio(lr, mask, "turn", "geometric").tolist() == [[0, 2, 2, 0, 3, 3, 3, 0]]
    assert unit_log_ratio(lr, mask, "turn", "product").tolist() == [[0, 4, 4, 0, 9, 9, 9, 0]]
    assert unit_log_ratio(lr, mask, "sequence", "product").tolist() == [
        [0, 13, 13, 0, 13, 13, 13, 0]
    ]
    assert unit_log_ratio(lr, mask, "sequence", "geometric")[0, 1].item() == pytest.approx(13 / 5)


def test_behavior_kl_is_kl_from_the_sampler_to_the_proximal_policy() -> None:
    """On tokens drawn from the behaviour policy, ``behavior/kl`` estimates KL(behav || prox).
    The estimator it replaces (k3 with the two policies swapped) read 1.23 at a true 0.58."""
    torch.manual_seed(0)
    for behav_p, prox_p in (
        ([0.7, 0.2, 0.1], [0.2, 0.3, 0.5]),
        ([0.9, 0.05, 0.05], [0.1, 0.1, 0.8]),
    ):
        behav, prox = torch.tensor(behav_p), torch.tensor(prox_p)
        true = float((behav * (behav / prox).log()).sum())
        tokens = torch.multinomial(behav, 200_000, replacement=True)
        lb, lp = behav.log()[tokens][None], prox.log()[tokens][None]
        estimate = float(behav_kl_of(lp, lb))
        assert estimate == pytest.approx(true, rel=0.03)
        swapped = float(behav_kl_of(lb, lp))  # the old argument order
        assert abs(swapped - true) > 0.2 * true  # wrong by far more than the sampling noise
        summary = weight_summary((lp - lb)[0])
        assert summary["behavior/kl"] == pytest.approx(estimate, rel=1e-5)


def behav_kl_of(proximal: torch.Tensor, behavior: torch.Tensor) -> torch.Tensor:
    return behavior_kl(proximal, behavior, torch.ones_like(proximal))


def test_weight_summary_quantiles() -> None:
    w = torch.tensor([1.0] * 90 + [2.0] * 9 + [1000.0])
    s = weight_summary(w.log())
    assert s["behavior/weight/q50"] == pytest.approx(1.0)
    assert s["behavior/weight/q90"] == pytest.approx(1.0 + 0.1 * 1.0, rel=0.2)
    assert s["behavior/weight/max"] == pytest.approx(1000.0)
    assert weight_summary(torch.zeros(0)) == {}


def test_token_staleness_by_turn() -> None:
    versions = torch.tensor([[-1, 0, 0, -1, 2, 2], [-1, 1, -1, 1, -1, -1]])
    mask = (versions >= 0).float()
    s = token_staleness(versions, mask, version=3)
    assert s["staleness/token_max"] == 3.0
    assert s["staleness/token_mean"] == pytest.approx((3 + 3 + 1 + 1 + 2 + 2) / 6)
    assert s["staleness/turn0_mean"] == pytest.approx((3 + 3 + 2) / 3)
    assert s["staleness/turn1_mean"] == pytest.approx((1 + 1 + 2) / 3)
