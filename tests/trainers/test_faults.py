"""Components that come back: ``kill -9`` of a server, a rollout worker or a learner rank in the
middle of a local run (``model=tiny``, ``env=calculator``), and the run still finishes with
exact accounting: every step once, the tasks ``0 .. steps * groups_per_step - 1`` each trained
once (none lost, none twice), every trajectory once, and the restart in ``faults.jsonl``, the
``restarts/*`` metrics and the summary. The 2-node loss is ``test_faults_cluster.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from areal_agents.files import read_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS, GROUPS = 6, 2
TINY = [
    "env=calculator",
    "model=tiny",
    "env.group_size=2",
    f"trainer.groups_per_step={GROUPS}",
    f"trainer.total_steps={STEPS}",
    "inference.max_tokens=8",
    "log.progress=false",
    "log.tensorboard=false",
    "eval.held_out_tasks=0",
    "trainer.checkpoint_interval_s=null",
    "trainer.checkpoint_every=2",
]

#: how each victim is found among the run's processes (name or command line)
VICTIMS = {
    "server": "areal_agents.serving.serve",
    "rollout_worker": "ray::RolloutWorkerActor",
    "learner": "ray::Learner",
}


def start_run(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "areal_agents.train", *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return read_jsonl(path, torn_ok=True) if path.is_file() else []


def wait_for_steps(proc: subprocess.Popen[bytes], run_dir: Path, n: int, log: Path) -> None:
    deadline = time.monotonic() + 300
    while len(rows(run_dir)) < n:
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 300
    while not condition():
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)


def find(root: int, pattern: str) -> list[psutil.Process]:
    """The processes under ``root`` whose name or command line contains ``pattern``."""
    found = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            if pattern in p.name() or pattern in " ".join(p.cmdline()):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def kill9(processes: list[psutil.Process]) -> None:
    for p in processes:
        os.kill(p.pid, signal.SIGKILL)


def check_accounting(run_dir: Path, steps: int = STEPS, groups: int = GROUPS) -> list[dict]:
    """Every step once; tasks 0 .. steps * groups - 1 trained once each; trajectories once."""
    done = rows(run_dir)
    assert [r["step"] for r in done] == list(range(1, steps + 1))
    tasks = [i for r in done for i in r["batch/task_indices"]]
    assert sorted(tasks) == list(range(steps * groups)), tasks  # none lost, none twice
    trajectories = [t for r in done for t in r["batch/traj_ids"]]
    assert len(trajectories) == len(set(trajectories)), "a trajectory was trained twice"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_version"] == steps and summary["finished"]
    return done


@pytest.mark.parametrize("victim", ["server", "rollout_worker", "learner"])
def test_a_component_killed_mid_run_comes_back_and_the_run_finishes_exactly(
    tmp_path: Path, victim: str
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "out.log"
    extra = ["trainer.learner_ranks=2"] if victim == "learner" else []
    proc = start_run([*TINY, *extra, "ray.num_cpus=2", f"output_dir={run_dir}"], log)
    try:
        wait_for_steps(proc, run_dir, 2, log)
        if victim == "learner":  # its checkpoint is written after the step's metrics row
            wait_for(lambda: (run_dir / "checkpoints" / "step_000002").is_dir(), proc, log)
        targets = find(proc.pid, VICTIMS[victim])
        assert targets, f"no {victim} process found"
        kill9(targets[-1:])  # one of them: the last learner rank (the one that is not rank 0)
        assert proc.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = check_accounting(run_dir)
    output = log.read_text()
    events = read_jsonl(run_dir / "faults.jsonl")
    assert [e["kind"] for e in events] == [victim], output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"][victim] == 1
    assert done[-1][f"restarts/{victim}"] == 1
    assert events[0]["restart_s"] > 0
    if victim == "learner":  # back to the checkpoint of step 2 (or 4), by itself, once
        assert "resuming from the last checkpoint (trainer.resume=auto)" in output
        assert events[0]["resumed_from"] in ("step_000002", "step_000004")
    else:  # reloaded at the version of the moment; its groups in flight admitted again
        assert events[0]["step"] >= 2
        assert done[-1]["buffer/requeued_groups"] >= events[0]["requeued"]


def test_with_resume_never_a_dead_learner_stops_the_run_with_how_to_resume(
    tmp_path: Path,
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "out.log"
    args = [*TINY, "ray.num_cpus=2", f"output_dir={run_dir}"]
    proc = start_run([*args, "trainer.resume=never"], log)
    try:
        wait_for_steps(proc, run_dir, 3, log)  # the checkpoint of step 2 is on disk
        kill9(find(proc.pid, VICTIMS["learner"]))
        assert proc.wait(timeout=300) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert "LearnerLost: learner rank 0 died" in output
    assert "the run's last checkpoint is step_00000" in output
    assert f"output_dir={run_dir} trainer.resume=auto" in output
    # and the command it names resumes the run to the end, with exact accounting
    proc = start_run(args, tmp_path / "again.log")
    assert proc.wait(timeout=600) == 0, (tmp_path / "again.log").read_text()[-3000:]
    check_accounting(run_dir)
