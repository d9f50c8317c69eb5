"""benchmarks/task_sampling_sim.py: rates read from a run's batches, and a simulation in which
rating families by their reward spread draws more groups that train than uniform choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.task_sampling_sim import _laplace, family_rates, simulate


def test_family_rates_are_each_familys_share_of_solved_episodes(tmp_path: Path) -> None:
    rows = [
        {"batch/task_ids": ["gen/a/1", "gen/b/2"], "batch/group_rewards": [[1, 0], [1, 1]]},
        {"batch/task_ids": ["gen/a/3"], "batch/group_rewards": [[0, 0]]},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert family_rates([tmp_path]) == {"gen/a": 0.25, "gen/b": 1.0}


def test_rating_by_spread_draws_more_groups_that_train_than_uniform_choice() -> None:
    # one family always solved, one never, one at even odds: only the last ever trains
    rates = {"solved": 1.0, "unsolved": 0.0, "even": 0.5}
    uniform = simulate(rates, None, groups=200, trials=20)
    learn = simulate(rates, _laplace, groups=200, trials=20)
    assert uniform == pytest.approx(1 / 3 * (1 - 2 * 0.5**4), abs=0.05)
    assert learn > uniform + 0.2
