"""benchmarks/rl_gain.py: its command line takes the variant's overrides after the options, and
its tables are computed from the stored entries."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import rl_gain


def entry(name: str, seed: int, gain: float, fixed: int, broken: int) -> dict[str, Any]:
    return {
        "env": "code_sandbox",
        "name": name,
        "seed": seed,
        "steps": 24,
        "update_kl": [0.001, None, 0.003],
        "held_out": {
            "before": 0.5,
            "after": 0.5 + gain / 100,
            "gain_points": gain,
            "ci95_points": [gain - 4, gain + 4],
            "improved": fixed,
            "regressed": broken,
            "mcnemar_p": 0.05,
        },
    }


def test_overrides_may_follow_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    def fake_run(env: str, seed: int, root: Any, name: str, overrides: Any, held: int) -> Any:
        seen.append((env, seed, name, list(overrides), held))
        return entry(name, seed, 1.0, 1, 0)

    monkeypatch.setattr(rl_gain, "run_variant", fake_run)
    monkeypatch.setattr(rl_gain, "_store", lambda e: None)
    rl_gain.main(["run", "--seeds", "1,2", "--name", "v", "trainer.lr=1e-5", "algo=grpo"])
    assert seen == [
        ("code_sandbox", 1, "v", ["trainer.lr=1e-5", "algo=grpo"], 128),
        ("code_sandbox", 2, "v", ["trainer.lr=1e-5", "algo=grpo"], 128),
    ]


def test_by_variant_sums_the_seeds_of_each_variant() -> None:
    entries = [
        entry("real", 0, 12.5, 18, 2),
        entry("real", 1, 8.0, 12, 2),
        entry("placebo", 0, -1.5, 3, 5),
        {**entry("broken", 0, 0.0, 0, 0), "held_out": None},  # a run without its evaluation
    ]
    table = rl_gain.by_variant(entries)
    rows = [line for line in table.splitlines() if line.startswith("| code_sandbox")]
    assert len(rows) == 2  # the run without a held-out result is left out
    placebo, real = rows  # sorted by name
    assert "| placebo | 0 | -1.5 | **-1.5** | -1.5 | 3 / 5 |" in placebo
    assert "| real | 0,1 | +12.5, +8.0 | **+10.2** | +8.0 | 30 / 4 | 2.00e-03 |" in real
    assert "+12.5** (+8.5 to +16.5)" in rl_gain.table(entries[:1])
    assert rl_gain.table(entries[:1]).endswith("| 24 | 2.0e-03 / 3.0e-03 |")  # mean / max
