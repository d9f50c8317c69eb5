"""benchmarks/code_grading.py runs and derives its figures (speed is printed, never asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import code_grading


def test_code_grading_benchmark_grades_right_and_wrong(tmp_path: Path) -> None:
    out = tmp_path / "code_grading.json"
    result = code_grading.main(["--backends", "process", "--grades", "2", "--json", str(out)])
    figures = result["process"]
    expected = {"procedural_right": 1.0, "procedural_wrong": 0.0, "humaneval_right": 1.0}
    for kind, mean_reward in expected.items():
        assert figures[kind]["n"] == 2 and figures[kind]["median_ms"] > 0
        assert figures[kind]["mean_reward"] == mean_reward
    assert json.loads(out.read_text())["process"]["procedural_right"]["n"] == 2
