"""Soak test of the training command: memory of every process and sandbox containers over time.

Runs ``python -m areal_agents.train`` (default: ``env=code_sandbox`` on the default model) for
``--minutes`` (30 by default), sampling every ``--every`` seconds the resident memory of each
process of the run — the driver, each Ray actor (learner ranks, rollout workers, the buffer),
Ray's own daemons, the inference server — and the number of sandbox containers
(label ``areal_agents.sandbox=1``). At the end it stops the run with SIGTERM (which closes the
servers, actors and sandboxes) and prints, per process role, the peak and the steady resident
memory, the growth of the steady state after warm-up, the container count over time, and
whether the targets held: whole run under 8 GB, growth after warm-up under 10 %, containers not
accumulating (and none left after the run).

    .venv/bin/python benchmarks/soak.py --minutes 30
    .venv/bin/python benchmarks/soak.py --minutes 2 -- env=calculator model=tiny   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, RESULTS, machine_info, write_json

GB = 1024**3
MB = 1024**2
LABEL = "areal_agents.sandbox=1"


def role(proc: psutil.Process) -> str:
    """A stable name for a process of the run (Ray actors by class, daemons by binary)."""
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if cmd.startswith("ray::"):
        return cmd.split()[0].split(".")[0]  # ray::Learner, ray::RolloutWorkerActor, ...
    if "areal_agents.serving.serve" in cmd:
        return "inference server"
    if "areal_agents.train" in cmd:
        return "driver"
    for daemon in ("raylet", "gcs_server", "dashboard", "log_monitor", "runtime_env", "monitor"):
        if daemon in cmd:
            return f"ray {daemon}"
    if "default_worker.py" in cmd:
        return "ray idle worker"
    return name


def containers(owners: set[int] | None = None) -> int:
    """Sandbox containers running now; with ``owners``, only those created by those pids (the
    docker backend labels each container with its creator's pid; other runs share the engine)."""
    try:
        out = subprocess.run(
            [
                "docker",
                "ps",
                "--filter",
                f"label={LABEL}",
                "--format",
                '{{.ID}} {{.Label "areal_agents.sandbox.pid"}}',
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return -1
    if out.returncode != 0:
        return -1
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    if owners is None:
        return len(rows)
    return sum(1 for r in rows if len(r) > 1 and r[1].isdigit() and int(r[1]) in owners)


def count_steps(metrics: Path) -> int:
    """Steps trained so far (lines of the run's metrics.jsonl)."""
    try:
        return len(metrics.read_text().splitlines())
    except OSError:
        return 0


def sample(root: psutil.Process) -> dict[str, Any]:
    """RSS by role (summed over processes of that role) and per process, plus containers."""
    procs = [root]
    with contextlib.suppress(psutil.NoSuchProcess):
        procs += root.children(recursive=True)
    seen: set[int] = set()
    by_pid: dict[int, tuple[str, int]] = {}
    by_role: dict[str, int] = defaultdict(int)
    for p in procs:
        if p.pid in seen:
            continue
        seen.add(p.pid)
        try:
            rss = p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        r = role(p)
        by_pid[p.pid] = (r, rss)
        by_role[r] += rss
    return {
        "t": time.monotonic(),
        "total": sum(rss for _, rss in by_pid.values()),
        "roles": dict(by_role),
        "pids": {pid: rss for pid, (_, rss) in by_pid.items()},
        "names": {pid: r for pid, (r, _) in by_pid.items()},
        "containers": containers(seen),
    }


def summarise(samples: list[dict[str, Any]], warmup_s: float, warmup_steps: int) -> dict[str, Any]:
    """Peak and steady memory; "steady" starts once ``warmup_steps`` steps are trained (the
    optimizer state exists, a checkpoint and a weight push have happened) and ``warmup_s``
    have passed."""
    t0 = samples[0]["t"]
    steady = [
        s for s in samples if s["t"] - t0 >= warmup_s and s["steps"] >= warmup_steps
    ] or samples[-1:]
    third = max(1, len(steady) // 3)
    early, late = steady[:third], steady[-third:]
    pids = sorted({k for s in samples for k in s["pids"]})
    last_name = {pid: s["names"][pid] for s in samples for pid in s["names"]}
    per_process = {}
    for pid in pids:
        values = [s["pids"].get(pid, 0) for s in samples]
        e = [s["pids"][pid] for s in early if pid in s["pids"]]
        la = [s["pids"][pid] for s in late if pid in s["pids"]]
        per_process[f"{last_name[pid]} [{pid}]"] = {
            "peak_mb": max(values) / MB,
            "steady_mb": statistics.median(la) / MB if la else 0.0,
            "growth_pct": (
                100 * (statistics.fmean(la) / statistics.fmean(e) - 1) if e and la else 0.0
            ),
        }
    total_early = statistics.fmean(s["total"] for s in early)
    total_late = statistics.fmean(s["total"] for s in late)
    counts = [s["containers"] for s in samples]
    return {
        "warmup_ended_s": round(steady[0]["t"] - t0),
        "series": [
            {
                "t": round(s["t"] - t0),
                "steps": s["steps"],
                "total_gb": round(s["total"] / GB, 3),
                "roles_mb": {k: round(v / MB) for k, v in s["roles"].items()},
                "containers": s["containers"],
            }
            for s in samples
        ],
        "per_process": per_process,
        "peak_total_gb": max(s["total"] for s in samples) / GB,
        "steady_total_gb": total_late / GB,
        "growth_after_warmup_pct": 100 * (total_late / total_early - 1),
        "containers_over_time": [(round(s["t"] - t0), s["containers"]) for s in samples],
        "containers_max": max(counts),
        "containers_late_max": max(s["containers"] for s in late),
        "containers_early_max": max(s["containers"] for s in early),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds before steady")
    parser.add_argument("--warmup-steps", type=int, default=3, help="steps before steady")
    parser.add_argument("--output-dir", default=None, help="run directory (default: a new one)")
    parser.add_argument("--json", default=str(RESULTS / "soak.json"))
    parser.add_argument("overrides", nargs="*", help="config overrides after --")
    args = parser.parse_args()

    out = args.output_dir or str(REPO / "runs" / f"soak-{int(time.time())}")
    overrides = args.overrides or ["env=code_sandbox"]
    command = [
        sys.executable,
        "-m",
        "areal_agents.train",
        *overrides,
        "trainer.total_steps=1000000",
        "log.progress=false",
        f"output_dir={out}",
    ]
    print("running:", " ".join(command[1:]), flush=True)
    before = machine_info()
    log = open(Path(out + ".log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    root = psutil.Process(proc.pid)
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60 * args.minutes

    def stop_early(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_early)
    signal.signal(signal.SIGINT, stop_early)  # also when started in the background
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            samples.append(sample(root))
            s = samples[-1]
            s["steps"] = count_steps(Path(out) / "metrics.jsonl")
            print(
                f"{s['t'] - samples[0]['t']:7.0f}s  total {s['total'] / GB:5.2f} GB  "
                f"containers {s['containers']:3d}  processes {len(s['pids'])}  "
                f"steps {s['steps']}",
                flush=True,
            )
            time.sleep(args.every)
    except KeyboardInterrupt:
        print("stopped early: summarising what was sampled", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # the driver unwinds and closes everything
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    time.sleep(3)
    left = containers({pid for s in samples for pid in s["pids"]})
    if proc.returncode not in (0, 128 + signal.SIGTERM, -signal.SIGTERM) and len(samples) < 3:
        print(f"the run failed (exit {proc.returncode}); see {out}.log")
        return 1
    result = summarise(samples, min(args.warmup, 60 * args.minutes / 3), args.warmup_steps)
    result["containers_after_run"] = left
    steps = count_steps(Path(out) / "metrics.jsonl")
    result["steps"] = steps
    print(f"\n{'process':45s} {'peak MB':>9s} {'steady MB':>10s} {'growth':>8s}")
    for name, row in sorted(result["per_process"].items(), key=lambda kv: -kv[1]["peak_mb"]):
        print(
            f"{name:45s} {row['peak_mb']:9.0f} {row['steady_mb']:10.0f} {row['growth_pct']:7.1f}%"
        )
    print(
        f"\nsteps trained: {steps} in {args.minutes:.0f} min; steady state from "
        f"{result['warmup_ended_s']} s (after {args.warmup_steps} steps)"
    )
    print(
        f"whole run: peak {result['peak_total_gb']:.2f} GB, steady {result['steady_total_gb']:.2f}"
        f" GB, growth after warm-up {result['growth_after_warmup_pct']:+.1f}%"
    )
    stride = max(1, len(samples) // 12)
    print("containers over time (s, count):", result["containers_over_time"][::stride])
    print(f"containers after the run: {left}")
    checks = {
        "under 8 GB": result["peak_total_gb"] < 8,
        "flat after warm-up (<10% growth)": result["growth_after_warmup_pct"] < 10,
        "containers not accumulating": result["containers_late_max"]
        <= max(result["containers_early_max"], 1)
        or result["containers_max"] < 0,
        "no containers left": left <= 0,
    }
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    write_json(
        args.json,
        {
            "command": command,
            "minutes": args.minutes,
            "machine": before,
            "result": result,
            "checks": checks,
        },
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
