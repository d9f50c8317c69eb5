"""Held-out changes are judged on the same tasks, with an interval: from the evaluations'
transcripts to ``summary.json``'s ``rl_gain`` and the closing screen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_agents.stats import compare_paired, mcnemar_p, paired_bootstrap, wilson_interval
from areal_agents.trainers.held_out import closing_screen, paired_gains, task_successes


def _eval(directory: Path, solved: list[bool], threshold: float = 1.0) -> None:
    directory.mkdir(parents=True)
    rows = [{"task_index": i, "reward": 1.0 if ok else 0.5} for i, ok in enumerate(solved)]
    (directory / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "summary.json").write_text(json.dumps({"pass_threshold": threshold}))


def test_paired_gains_pair_tasks_and_name_the_interval(tmp_path: Path) -> None:
    before = [i % 4 != 0 for i in range(128)]  # 96 solved
    after = [ok or i % 8 == 0 for i, ok in enumerate(before)]  # 16 more: 112
    after[1] = False  # one broken
    _eval(tmp_path / "base", [False] * 128)
    _eval(tmp_path / "before", before)
    _eval(tmp_path / "after", after)
    gains = paired_gains(tmp_path)
    rl = gains["rl_gain"]
    assert (rl["n"], rl["improved"], rl["regressed"]) == (128, 16, 1)
    assert rl["gain_points"] == pytest.approx(100 * 15 / 128, abs=0.05)
    assert rl["mcnemar_p"] == pytest.approx(mcnemar_p(16, 1), abs=1e-4) and rl["mcnemar_p"] < 0.01
    lo, hi = rl["ci95_points"]
    assert 0 < lo < rl["gain_points"] < hi
    assert gains["warm_start_gain"]["improved"] == 96 and gains["gain"]["improved"] == 111
    # a threshold below the 0.5 rewards counts them all solved
    _eval(tmp_path / "lenient", [False] * 4, threshold=0.5)
    assert task_successes(tmp_path / "lenient") == {0: True, 1: True, 2: True, 3: True}
    assert task_successes(tmp_path / "missing") is None
    summary = {
        "held_out": {
            "tasks": 128,
            "base": {"success": 0.0},
            "before": {"success": 96 / 128},
            "after": {"success": 111 / 128},
            **gains,
        }
    }
    screen = closing_screen(summary)
    assert "RL:              75.0% -> 86.7%  (+11.7 points (95% CI +" in screen
    assert "16 fixed, 1 broken; McNemar p=" in screen


def test_intervals_by_hand() -> None:
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)  # 2 * (1/2)^5
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-3)
    same = paired_bootstrap([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
    assert same == (0.0, 0.0)
    c = compare_paired({"a": True, "b": False, "c": False}, {"a": True, "b": True, "d": True})
    assert (c.n, c.improved, c.regressed, c.before, c.after) == (2, 1, 0, 0.5, 1.0)
    with pytest.raises(ValueError, match="share no task"):
        compare_paired({"a": True}, {"b": True})
