"""benchmarks/gpu/measure.py runs with torch, transformers and peft alone — what the lent GPU
machine has — here on the CPU, with a small synthetic model, ray/vLLM/gymnasium/openai blocked."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

BLOCKED = ("ray", "vllm", "gymnasium", "openai", "trl", "docker")

RUN = textwrap.dedent(
    """
    import runpy, sys
    for name in {blocked!r}:
        sys.modules[name] = None  # importing it raises ImportError, as on the GPU machine
    sys.argv = ["measure.py", *sys.argv[1:]]
    runpy.run_path("benchmarks/gpu/measure.py", run_name="__main__")
    """
)


def test_the_gpu_measurements_run_without_ray_vllm_gymnasium_or_openai(tmp_path: Path) -> None:
    out, profile = tmp_path / "gpu.json", tmp_path / "profile.yaml"
    args = [
        "--device", "cpu", "--quick", "--dtype", "float32",
        "--synthetic-hidden", "64", "--synthetic-layers", "2", "--work", str(tmp_path),
        "--json", str(out), "--profile", str(profile),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(blocked=BLOCKED), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    runs = result["learner"]["runs"]
    assert [r["rows"] for r in runs] == [2, 4]
    assert all(r["plain_s"] > 0 and r["fsdp1_s"] > 0 for r in runs)
    assert result["decode"]["concurrency"] == [1, 2]
    assert all(rate > 0 for rate in result["decode"]["tokens_per_s"])
    agreement = result["logprob_agreement"]
    assert agreement["tokens"] == 2 * 8
    # same weights, same dtype, the same tokens: the learner reproduces the engine's log-probs
    assert agreement["max_abs_diff"] < 1e-3, agreement
    # the profile is in the simulator's own format
    from areal_agents.simulation.profile import load_profile

    loaded = load_profile(profile)
    assert loaded.server.tokens_per_s(1) == result["decode"]["tokens_per_s"][0]
    assert yaml.safe_load(profile.read_text())["push_s"] == result["push_s"]
