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


def test_fair_calibration_replays_each_runs_tasks_on_its_placements_profile(
    tmp_path: Path,
) -> None:
    """A results file shaped as ``async_vs_sync.py`` writes it: each run is simulated with its
    own settings and tasks, on the profile of its mode's placement, with the learner and push
    of its mode's first seed (those rows are marked fitted)."""
    import _fair
    import sim_calibration_fair

    env = "benchmarks.workloads:LongTailCalculator-v0"
    steps, groups = 3, 2
    indices = list(range(steps * groups))

    def run(setting: str, seed: int, eta: int, per_question: float) -> dict[str, object]:
        rounds = _fair.task_rounds(env, seed, indices, frozenset())
        trained = [rounds[i] for i in indices]
        turns = per_question * sum(trained) / len(trained)
        per_step = [
            {
                "time/wait_s": 5.0, "time/train_s": 4.0 + 0.01 * t, "time/sync_s": 0.5,
                "time/push_s": 2.0, "tokens/policy": t, "episodes": 4,
                "episode/turns_mean": turns, "learner/forward_tokens": 3 * t,
                "batch/task_indices": indices[groups * s : groups * (s + 1)],
            }
            for s, t in enumerate((100, 200, 300))
        ]  # fmt: skip
        return {
            "setting": setting, "seed": seed, "staleness_bound": eta, "steps": steps,
            "elapsed_s": 60.0, "tokens_per_s": 10.0, "samples_per_s": 0.2,
            "turns_mean": turns, "policy_tokens_mean": 25.0 * turns, "per_step": per_step,
        }  # fmt: skip

    results = {
        "args": {
            "env": env, "held_out": 0, "steps": steps, "groups_per_step": groups,
            "group_size": 2, "concurrent_groups": 4,
        },
        "runs": [
            run("sync_seed0", 0, 0, 2.0), run("async_s2_seed0", 0, 2, 2.0),
            run("sync_seed1", 1, 0, 1.5), run("async_s2_seed1", 1, 2, 1.5),
        ],
    }  # fmt: skip
    path = tmp_path / "fair.json"
    path.write_text(json.dumps(results))
    rows = {r["run"]: r for r in sim_calibration_fair.calibrate_fair(path)}
    assert [rows[f"F {s}"]["fitted"] for s in ("sync_seed0", "async_s2_seed0")] == [True, True]
    assert not rows["F sync_seed1"]["fitted"] and not rows["F async_s2_seed1"]["fitted"]
    assert rows["F sync_seed0"]["profile"] == "cpu_2core_vllm_colocated"
    assert rows["F async_s2_seed1"]["profile"] == "cpu_2core_vllm_split"
    for row in rows.values():  # the replay trains the run's tasks at its turns per question
        m, p = row["measured"], row["predicted"]
        assert p["turns_mean"] == pytest.approx(m["turns_mean"], abs=0.26)
        assert p["elapsed_s"] > 0 and set(row["error_pct"]) >= {"elapsed_s", "tokens_per_s"}
