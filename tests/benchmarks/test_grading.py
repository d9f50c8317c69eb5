"""benchmarks/grading.py runs and derives its figures (speed is printed, never asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import grading


def test_grading_benchmark_measures_both_ways_and_timeouts(tmp_path: Path) -> None:
    out = tmp_path / "grading.json"
    result = grading.main(["--grades", "5", "--timeouts", "1", "--json", str(out)])
    figures = result["figures"]
    for key in (
        "math_verify_in_thread",
        "math_verify_in_grading_process",
        "round_trip_trivial_job",
    ):
        assert figures[key]["n"] == 5 and figures[key]["median_ms"] > 0
    assert figures["timeout_0.5s_returned_after"]["n"] == 1
    assert figures["timeout_0.5s_returned_after"]["median_ms"] >= 500
    assert json.loads(out.read_text())["figures"]["zygote_start_s"] > 0
