"""benchmarks/default_command.py derives its figures from a run's summary and metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import default_command
from benchmarks.default_command import collect, plot


def _summary() -> dict[str, Any]:
    return {
        "env": "code_sandbox",
        "steps": 3,
        "wall_s": 600.0,
        "training_s": {"warm_start": 150.0, "rl": 610.0, "total": 760.0},
        "stop_reason": "time_budget",
        "time_to_first_step_s": 300.0,
        "time_to_first_step_without_eval_s": 120.0,
        "warm_start": {"steps": 4},
        "held_out": {
            "tasks": 64,
            "seed": 0,
            "base": {"success": 0.25},
            "before": {"success": 0.5},
            "after": {"success": 0.625},
        },
    }


def test_collect_splits_the_warm_start_gain_from_the_rl_gain(tmp_path: Path) -> None:
    summary = _summary()
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    rows = [{"time/elapsed_s": 100.0 * i, "reward/mean": 0.25 * i} for i in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = collect(tmp_path, [(30, 4.0), (60, 6.0)])
    held = result["held_out"]
    assert (held["base"], held["after_warm_start"], held["after_rl"]) == (0.25, 0.5, 0.625)
    assert held["gain_points"] == 37.5  # base -> after RL, the command's whole gain
    assert held["warm_start_gain_points"] == 25.0 and held["rl_gain_points"] == 12.5
    assert result["reward_curve"] == [[100.0, 0.25], [200.0, 0.5]]
    assert result["training_s"]["total"] == 760.0 and result["rl_wall_s"] == 600.0
    assert result["load_average_1m"]["mean"] == 5.0 and result["load_average_1m"]["max"] == 6.0
    assert held["selection"] is None and held["rl_gain_last_points"] is None
    # validation chose step 2 of 3: the last step's own held-out score is kept beside it
    chosen = {"chosen_step": 2, "last_step": 3, "candidates": {"0": 0.5, "2": 0.7, "3": 0.6}}
    summary["held_out"].update(selection=chosen, last={"success": 0.375})
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    held = collect(tmp_path)["held_out"]
    assert held["selection"] == chosen and held["last_step"] == 0.375
    assert held["rl_gain_points"] == 12.5 and held["rl_gain_last_points"] == -12.5
    # without a warm start the gain is before -> after
    summary["held_out"].pop("base")
    summary["held_out"].pop("last")
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    held = collect(tmp_path)["held_out"]
    assert held["gain_points"] == 12.5 and held["warm_start_gain_points"] is None
    assert held["before_rl"] == 0.5 and held["after_warm_start"] is None
    png = tmp_path / "curve.png"
    plot([{**collect(tmp_path), "seed": 0}], png)
    assert png.stat().st_size > 1000


def test_a_tagged_run_s_plot_is_named_by_its_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--tag`` names the results file and the plot: a second seed's run of an env, tagged,
    does not replace the env's plot of an earlier run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(_summary()))
    (run / "metrics.jsonl").write_text(json.dumps({"time/elapsed_s": 1.0, "reward/mean": 0.5}))
    for sub in ("results", "plots"):
        (tmp_path / "benchmarks" / sub).mkdir(parents=True)
    monkeypatch.setattr(default_command, "ROOT", tmp_path)
    default_command.main(["--env", "search", "--seeds", "1", "--collect", str(run), "--tag", "s1"])
    out = tmp_path / "benchmarks"
    assert (out / "results" / "default_command_s1.json").is_file()
    assert [p.name for p in (out / "plots").iterdir()] == ["default_command_s1.png"]
