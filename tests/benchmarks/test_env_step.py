"""benchmarks/env_step.py runs and prints its figures (speed is printed, never asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import env_step


def test_step_overhead_measures_every_kind_of_step() -> None:
    figures = env_step.step_overhead("calculator", steps=60)
    assert figures["reset"]["n"] == 60
    assert figures["step_final_answer"]["n"] == 30
    assert figures["step_with_tool_call"]["n"] == 30
    for key in ("reset", "step_final_answer", "step_with_tool_call"):
        row = figures[key]
        assert 0 < row["median_us"] <= row["p90_us"] or row["median_us"] == row["p90_us"]


def test_main_without_rollout_prints_and_writes_json(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "env.json"
    result = env_step.main(["--steps", "40", "--skip-rollout", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "step_final_answer" in printed and "target < 1 ms" in printed
    assert out.is_file() and "rollout" not in result
    assert result["machine"]["cpus"] >= 1


@pytest.mark.slow
def test_rollout_sweep_on_the_tiny_model(capsys) -> None:  # type: ignore[no-untyped-def]
    result = env_step.main(
        ["--model", "tiny", "--steps", "20", "--concurrency", "1,2", "--episodes", "2",
         "--max-tokens", "8"]
    )  # fmt: skip
    levels = result["rollout"]["levels"]
    assert [lv["concurrency"] for lv in levels][:1] == [1]
    assert all(lv["episodes"] == 2 and lv["tokens"] > 0 for lv in levels)
    assert "tok/s" in capsys.readouterr().out
