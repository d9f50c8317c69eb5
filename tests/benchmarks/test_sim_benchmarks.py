"""The simulator's benchmark scripts run and report (speed is printed, never asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import buffer_scale
import sim_calibration
import sim_scale

from areal_agents.simulation import load_profile


def test_calibration_simulates_every_measured_run_with_its_settings() -> None:
    rows = sim_calibration.calibrate(load_profile("cpu_2core_builtin"))
    assert len(rows) == 11  # Run A (5 settings), B (3), C (3)
    for row in rows:
        m, p = row["measured"], row["predicted"]
        err = 100 * (p["elapsed_s"] - m["elapsed_s"]) / m["elapsed_s"]
        assert row["error_pct"]["elapsed_s"] == pytest.approx(err, abs=0.06)
        if row["run"].split()[1] == "sync":
            assert p["staleness_mean"] == 0.0
    # the profile describes Run C's engine: its three runs are the calibration's claim
    assert all(r["within_15pct"] for r in rows if r["run"].startswith("C "))


def test_buffer_scale_measures_every_call() -> None:
    row = buffer_scale.measure(100, "ready", rounds=400)
    assert row["batches"] > 0 and row["groups_per_step"] == 12
    assert row["admit_us"] > 0 and row["complete_us"] > 0 and row["pop_batch_us_per_group"] > 0


def test_sim_scale_prints_and_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "scale.json"
    argv = ["sim_scale", "--servers", "4", "--episodes", "64", "--steps", "2", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    sim_scale.main()
    assert "4 servers, 64 concurrent episodes, 2 steps" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["steps"] == 2 and data["staleness_max"] <= 4
