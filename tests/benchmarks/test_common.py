"""benchmarks/_common.py: results are committed, so they carry no absolute path of the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _common


def test_write_json_keeps_no_absolute_paths(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    data = {
        "model": str(_common.REPO / "runs" / "warm_start"),
        "others": [f"90% {tmp_path}/env/bin/python3 -c sys.path = ['{tmp_path}/x', 'y']"],
        "url": "http://127.0.0.1:8000/v1/chat/completions",
        "ratio": 1.5,
    }
    _common.write_json(out, data)
    text = out.read_text()
    assert str(tmp_path) not in text and str(_common.REPO) not in text
    back = json.loads(text)
    assert back["model"] == "runs/warm_start"
    assert back["others"] == ["90% python3 -c sys.path = ['x', 'y']"]
    assert back["url"] == data["url"] and back["ratio"] == 1.5
    assert "loadavg_end" in back


def test_a_benchmark_run_as_a_script_imports_the_workloads(tmp_path: Path) -> None:
    """``python benchmarks/async_vs_sync.py`` has ``benchmarks/`` on its path, not the checkout;
    its environment, ``benchmarks.workloads:LongTailCalculator-v0``, must still be made (the
    fair run crashed there after its first training run)."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        f"sys.path[0] = {str(_common.REPO / 'benchmarks')!r}\n"
        "import _common  # noqa: F401\n"
        "from areal_agents.envs.registry import make_env\n"
        "env = make_env('benchmarks.workloads:LongTailCalculator-v0')\n"
        "print(type(env.unwrapped).__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "LongTailCalculator"
