"""What a restart costs: an inference server, a rollout worker, a learner rank, each killed with
``kill -9`` in the middle of a small run, as ``tests/trainers/test_faults.py`` kills them.

    python benchmarks/restart_cost.py [--kinds server,rollout_worker,learner] [--repeats 1]
        [--json results/restart_cost.json]

Each repeat of each kind is one local run (``env=calculator model=tiny``, 6 steps of 2 groups
of 2 episodes, a checkpoint every 2 steps; the learner's runs with 2 ranks, the last one
killed) whose victim is killed once step 2 is recorded (and, for the learner, once its
checkpoint is on disk). It prints, per kind:

- ``restart_s``: what the run's ``faults.jsonl`` says the restart took. A server's counts from
  the supervisor seeing it dead to the workers resumed on the new server loaded with the newest
  weights; a worker's, to the new worker constructed and running; a learner's, from the lost
  step to the resumed run's learners holding the checkpoint again (a new Ray instance,
  servers, learners: the whole start of a run).
- ``kill_to_record_s``: from the kill to that line being written (the death noticed, too).
- ``stalled_step_s``: the longest step after the kill against the median step of the same run
  (the training time the restart cost, when it stalled a step; generation ahead of the learner
  may hide it).

The run must finish with every task trained once; a run that does not is reported as failed.
Times depend on the machine's load: the ``machine`` section says what else ran.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine_info, write_json

__all__ = ["KINDS", "VICTIMS", "exact_accounting", "figures_of", "run_args", "summarize"]

KINDS = ("server", "rollout_worker", "learner")
STEPS, GROUPS = 6, 2
#: how each victim is found among the run's processes (name or command line)
VICTIMS = {
    "server": "areal_agents.serving.serve",
    "rollout_worker": "ray::RolloutWorkerActor",
    "learner": "ray::Learner",
}


def run_args(kind: str, run_dir: Path) -> list[str]:
    """The training command's arguments for one measurement of ``kind`` (test_faults' run)."""
    args = [
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
        "ray.num_cpus=2",
        f"output_dir={run_dir}",
    ]
    return [*args, "trainer.learner_ranks=2"] if kind == "learner" else args


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    from areal_agents.files import read_jsonl

    path = run_dir / "metrics.jsonl"
    return read_jsonl(path, torn_ok=True) if path.is_file() else []


def exact_accounting(rows: Sequence[dict[str, Any]], steps: int, groups: int) -> bool:
    """Every step once, the tasks ``0 .. steps * groups - 1`` once each, no trajectory twice.

    >>> row = {"step": 1, "batch/task_indices": [1, 0], "batch/traj_ids": ["a", "b"]}
    >>> exact_accounting([row], steps=1, groups=2)
    True
    >>> exact_accounting([{**row, "batch/task_indices": [0, 0]}], steps=1, groups=2)
    False
    """
    tasks = sorted(i for r in rows for i in r["batch/task_indices"])
    trajectories = [t for r in rows for t in r["batch/traj_ids"]]
    return (
        [r["step"] for r in rows] == list(range(1, steps + 1))
        and tasks == list(range(steps * groups))
        and len(trajectories) == len(set(trajectories))
    )


def summarize(
    kind: str, events: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], killed_at: float
) -> dict[str, Any]:
    """One measurement's figures from the run's ``faults.jsonl`` lines, its metric rows and
    the wall-clock time of the kill."""
    mine = [e for e in events if e["kind"] == kind]
    if len(mine) != 1 or len(events) != 1:
        raise ValueError(f"expected one {kind} restart, faults.jsonl has {events}")
    event = mine[0]
    # a step whose row was written after the kill; rows carry no wall time, so take the
    # steps after the one recorded when the kill happened (the learner's: after the resume)
    after = [r for r in rows if r["step"] > event.get("step", 0)]
    step_s = [float(r["time/step_s"]) for r in rows]
    return {
        "restart_s": float(event["restart_s"]),
        "kill_to_record_s": round(float(event["at"]) - killed_at, 3),
        "at_step": event.get("step"),
        "requeued_groups": event.get("requeued"),
        "stalled_step_s": max((float(r["time/step_s"]) for r in after), default=None),
        "median_step_s": round(statistics.median(step_s), 3) if step_s else None,
    }


def figures_of(measurements: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: the median and every value of ``restart_s`` and ``kill_to_record_s``.

    >>> figures_of([{"kind": "server", "restart_s": 2.0}, {"kind": "server", "restart_s": 4.0},
    ...             {"kind": "server", "failed": "the run exited 1"}])
    {'server': {'n': 2, 'failed': 1, 'restart_s_median': 3.0, 'restart_s': [2.0, 4.0]}}
    """
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(m["kind"] for m in measurements):
        mine = [m for m in measurements if m["kind"] == kind]
        ok = [m for m in mine if "failed" not in m]
        entry: dict[str, Any] = {"n": len(ok), "failed": len(mine) - len(ok)}
        for key in ("restart_s", "kill_to_record_s"):
            values = [m[key] for m in ok if key in m]
            if values:
                entry[f"{key}_median"] = round(statistics.median(values), 3)
                entry[key] = values
        out[kind] = entry
    return out


def _victims(root: int, pattern: str) -> list[int]:
    import psutil

    found = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            if pattern in p.name() or pattern in " ".join(p.cmdline()):
                found.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def _wait(condition: Any, proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended early (exit {proc.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError("the run made no progress")
        time.sleep(0.2)


def measure_one(kind: str, work: Path, timeout_s: float = 900) -> dict[str, Any]:
    """One run of ``kind``: kill, wait for the end, read the figures."""
    from areal_agents.files import read_jsonl

    run_dir, log = work / "run", work / "out.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_agents.train", *run_args(kind, run_dir)],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait(lambda: len(_rows(run_dir)) >= 2, proc)
        if kind == "learner":  # its checkpoint is written after the step's metrics row
            _wait(lambda: (run_dir / "checkpoints" / "step_000002").is_dir(), proc)
        victims = _victims(proc.pid, VICTIMS[kind])
        if not victims:
            raise RuntimeError(f"no {kind} process found")
        killed_at = time.time()
        os.kill(victims[-1], signal.SIGKILL)  # the learner's: the rank that is not rank 0
        code = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if code != 0:
        raise RuntimeError(f"the run exited {code}: {log.read_text()[-2000:]}")
    rows = _rows(run_dir)
    if not exact_accounting(rows, STEPS, GROUPS):
        raise RuntimeError("the run's accounting is not exact")
    summary = json.loads((run_dir / "summary.json").read_text())
    figures = summarize(kind, read_jsonl(run_dir / "faults.jsonl"), rows, killed_at)
    return {"kind": kind, **figures, "run_s": summary["times"]["total_s"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; choose from {','.join(KINDS)}")
    machine = machine_info()
    measurements: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for kind in kinds:  # interleaved: load from other jobs hits every kind alike
            with tempfile.TemporaryDirectory(prefix="areal-restart-") as tmp:
                try:
                    m = measure_one(kind, Path(tmp))
                except (RuntimeError, ValueError) as e:
                    m = {"kind": kind, "failed": str(e)}
            m["repeat"] = repeat
            print(json.dumps(m), flush=True)
            measurements.append(m)
    figures = figures_of(measurements)
    for kind, entry in figures.items():
        print(f"{kind:16s} {entry}")
    result = {
        "machine": machine,
        "command": "python benchmarks/restart_cost.py " + " ".join(argv or sys.argv[1:]),
        "figures": figures,
        "measurements": measurements,
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
