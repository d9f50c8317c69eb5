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


def test_prefix_delta_reports_what_the_cache_did_during_a_level() -> None:
    before = {"lookups": 2, "looked_up_tokens": 800, "reused_tokens": 300, "entries": 1}
    after = {"lookups": 6, "hits": 3, "looked_up_tokens": 2400, "reused_tokens": 1500}
    delta = env_step._prefix_delta(before, {**after, "entries": 2, "bytes": 10})
    assert delta["lookups"] == 4 and delta["hits"] == 3 and delta["reused_tokens"] == 1200
    assert delta["reused_share"] == 0.75 and (delta["entries"], delta["bytes"]) == (2, 10)
    assert env_step._prefix_delta({}, {})["reused_share"] == 0.0  # a server without the cache


def test_engine_delta_reports_the_engines_seconds_during_a_level() -> None:
    before = {"decode_steps": 10, "prefill_s": 1.0, "prefill_cpu_s": 0.5, "decode_s": 2.0}
    after = {"decode_steps": 30, "prefill_s": 4.0, "prefill_cpu_s": 2.5, "decode_s": 2.5}
    delta = env_step._engine_delta(before, {**after, "decode_cpu_s": 1.0})
    assert delta == {
        "decode_steps": 20,
        "prefill_s": 3.0,
        "prefill_cpu_s": 2.0,
        "decode_s": 0.5,
        "decode_cpu_s": 1.0,
    }
    assert env_step._engine_delta({}, {"decode_steps": 3}) == {"decode_steps": 3}  # an older server
