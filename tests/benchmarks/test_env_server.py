"""benchmarks/env_server.py runs and prints its figures (speed is printed, never asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import env_server


def test_overhead_and_load_on_a_real_server_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "env_server.json"
    result = env_server.main(
        ["--steps", "15", "--levels", "1,3", "--seconds", "0.5", "--json", str(out)]
    )
    printed = capsys.readouterr().out
    assert "adds < 2 ms" in printed and "sessions/s" in printed
    overhead = result["overhead"]
    assert set(overhead) == {"local", "http", "websocket"}
    for name in ("local", "http", "websocket"):
        assert overhead[name]["step"]["n"] == 30  # a tool-call step and an answer per episode
        assert overhead[name]["reset"]["n"] == 15
    for name in ("http", "websocket"):  # derived from the medians it printed
        expected = overhead[name]["step"]["median_us"] - overhead["local"]["step"]["median_us"]
        assert overhead[name]["added_ms_per_step"] == pytest.approx(expected / 1000, abs=1e-3)
    rows = result["load"]
    assert [(r["transport"], r["clients"]) for r in rows] == [
        ("http", 1), ("http", 3), ("websocket", 1), ("websocket", 3)
    ]  # fmt: skip
    for row in rows:
        assert row["errors"] == 0 and row["sessions"] >= 1
        assert row["step"]["n"] == 2 * row["sessions"]
        assert row["sessions_per_s"] == pytest.approx(row["sessions"] / row["seconds"], rel=0.02)
    saved = json.loads(out.read_text())
    assert saved["machine"]["cpus"] >= 1 and saved["load"] == rows
