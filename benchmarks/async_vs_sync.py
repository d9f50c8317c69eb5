"""Asynchronous vs synchronous training, side by side in one run.

The same environment, model, algorithm, machine and number of trained samples, trained by
``python -m areal_agents.train`` once synchronously (``trainer.mode=sync``: staleness 0, no
overlap — generate a batch, train, push, repeat) and once per asynchronous staleness bound
(``trainer.mode=async trainer.max_staleness=S``). The workload has a long tail of episode
lengths (``benchmarks.workloads:LongTailCalculator-v0``: half the tasks one question, one in
ten twelve questions).

Printed per setting: trained tokens/s, samples/s, the idle fraction of generation and of
learning, mean staleness, final reward, and the async/sync throughput ratio. Idle fractions are
measured from outside: every ``--sample-s`` seconds the CPU time of the inference server process
and of the learner rank processes is read; a process that used less than ``--busy-threshold`` of
a core in the interval was idle. The learner's own record (``time/wait_s``: waiting for a batch)
is printed next to it.

The hardware split is the same for every setting: each process (inference server, learner rank,
rollout worker) runs torch with ``--threads`` threads (default 1: on 2 cores, one core's worth
for generation and one for learning; more threads per process than cores oversubscribe the
machine and OpenMP threads spin against each other).

    python benchmarks/async_vs_sync.py --model runs/cpu_quickstart/warm_start \\
        --json benchmarks/results/async_vs_sync.json --plots benchmarks/plots
    python benchmarks/async_vs_sync.py --model tiny --steps 2 --staleness 0,2   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine_info, write_json

__all__ = ["main", "run_setting", "summarize"]

WORKLOAD = "benchmarks.workloads:LongTailCalculator-v0"


class Monitor(threading.Thread):
    """Samples the CPU use of the server and learner processes of one training run."""

    def __init__(self, pid: int, metrics: Path, every_s: float, threshold: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.metrics, self.every_s, self.threshold = pid, metrics, every_s, threshold
        self.samples: list[dict[str, Any]] = []
        self.loop_start: float | None = None
        self.threads: dict[str, str] = {}
        self._halt = threading.Event()

    def _roles(self) -> dict[int, str]:
        import psutil

        roles: dict[int, str] = {}
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return roles
        for proc in children:
            try:
                cmd = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if "areal_agents.serving.serve" in cmd or "vllm.entrypoints" in cmd:
                roles[proc.pid] = "generation"
            elif cmd.startswith("ray::Learner"):
                roles[proc.pid] = "learning"
            elif cmd.startswith("ray::RolloutWorker"):
                roles[proc.pid] = "rollout"
        return roles

    def _cpu(self, pid: int) -> float | None:
        import psutil

        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return None
        return float(t.user + t.system)

    def _omp(self, pid: int, role: str) -> None:
        if role in self.threads:
            return
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return
        omp = [e.decode().split("=", 1)[1] for e in env if e.startswith(b"OMP_NUM_THREADS=")]
        self.threads[role] = omp[0] if omp else "unset"

    def run(self) -> None:
        last: dict[int, float] = {}
        last_t = time.monotonic()
        lines = 0
        while not self._halt.wait(self.every_s):
            now = time.monotonic()
            roles = self._roles()
            use: dict[str, float] = {}
            for pid, role in roles.items():
                self._omp(pid, role)
                cpu = self._cpu(pid)
                if cpu is None:
                    continue
                if pid in last:
                    share = (cpu - last[pid]) / max(now - last_t, 1e-6)
                    use[role] = max(use.get(role, 0.0), share)
                last[pid] = cpu
            last_t = now
            self.samples.append({"t": now, **{k: round(v, 3) for k, v in use.items()}})
            try:
                rows = self.metrics.read_text().splitlines() if self.metrics.exists() else []
            except OSError:
                rows = []
            if len(rows) > lines:
                lines = len(rows)
                try:
                    elapsed = float(json.loads(rows[-1])["time/elapsed_s"])
                    self.loop_start = now - elapsed
                except (ValueError, KeyError):
                    pass

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def idle_fractions(self, start: float, end: float) -> dict[str, float | None]:
        window = [s for s in self.samples if start <= s["t"] <= end]
        out: dict[str, float | None] = {}
        for role in ("generation", "learning"):
            seen = [float(s[role]) for s in window if role in s]
            out[role] = (
                round(sum(1 for v in seen if v < self.threshold) / len(seen), 3) if seen else None
            )
        return out


def _overrides(args: argparse.Namespace, staleness: int, out_dir: Path) -> list[str]:
    mode = ["trainer.mode=sync"] if staleness == 0 else [
        "trainer.mode=async", f"trainer.max_staleness={staleness}"
    ]  # fmt: skip
    return [
        f"env={args.env}",
        f"model={args.model}",
        f"env.group_size={args.group_size}",
        f"trainer.groups_per_step={args.groups_per_step}",
        f"trainer.total_steps={args.steps}",
        f"trainer.lr={args.lr}",
        f"trainer.max_concurrent_groups={args.concurrent_groups}",
        f"trainer.seed={args.seed}",
        "trainer.checkpoint_every=0",
        "eval.held_out_tasks=0",  # throughput only: no held-out evaluation around the runs
        "trainer.resume=never",
        f"inference.max_tokens={args.max_tokens}",
        "algo=grpo",
        "algo.loss=decoupled_ppo",
        "log.progress=false",
        "log.tensorboard=false",
        f"output_dir={out_dir}",
        *mode,
        *args.extra,
    ]


def run_setting(args: argparse.Namespace, staleness: int) -> dict[str, Any]:
    """Train once with ``staleness`` (0 = sync) and measure it."""
    name = "sync" if staleness == 0 else f"async_s{staleness}"
    out_dir = Path(args.out) / name
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    command = [sys.executable, "-m", "areal_agents.train", *_overrides(args, staleness, out_dir)]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    threads = str(args.threads)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    log_path = Path(args.out) / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        monitor = Monitor(proc.pid, out_dir / "metrics.jsonl", args.sample_s, args.busy_threshold)
        monitor.start()
        try:
            code = proc.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = -1
        finally:
            monitor.stop()
    result = summarize(out_dir / "metrics.jsonl", monitor)
    result.update(
        {
            "setting": name,
            "staleness_bound": staleness,
            "exit_code": code,
            "process_wall_s": round(time.monotonic() - started, 1),
            "omp_threads": monitor.threads,
            "command": " ".join(command[1:]),
        }
    )
    if code != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        result["log_tail"] = tail
        print(f"  {name}: the trainer exited with {code}; log tail:\n{tail}", file=sys.stderr)
    return result


def summarize(metrics_path: Path, monitor: Monitor | None = None) -> dict[str, Any]:
    """The figures of one run from its ``metrics.jsonl`` (and the CPU samples)."""
    rows = []
    if metrics_path.exists():
        rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    if not rows:
        return {"steps": 0}
    elapsed = float(rows[-1]["time/elapsed_s"])
    episodes = sum(int(r["episodes"]) for r in rows)
    tokens = sum(int(r["tokens/policy"]) for r in rows)
    tail = rows[-max(1, len(rows) // 3) :]
    stale = sum(float(r["staleness/mean"]) * int(r["episodes"]) for r in rows) / max(episodes, 1)
    out: dict[str, Any] = {
        "steps": len(rows),
        "episodes": episodes,
        "trained_tokens": tokens,
        "elapsed_s": round(elapsed, 1),
        "tokens_per_s": round(tokens / elapsed, 2),
        "samples_per_s": round(episodes / elapsed, 4),
        "staleness_mean": round(stale, 3),
        "staleness_max": max(int(r["staleness/max"]) for r in rows),
        "reward_first": round(float(rows[0]["reward/mean"]), 4),
        "reward_final": round(statistics.fmean(float(r["reward/mean"]) for r in tail), 4),
        "learner_wait_frac": round(sum(float(r["time/wait_s"]) for r in rows) / elapsed, 3),
        "train_s": round(sum(float(r["time/train_s"]) for r in rows), 1),
        "sync_s": round(sum(float(r["time/sync_s"]) for r in rows), 1),
        "turns_mean": round(statistics.fmean(float(r["episode/turns_mean"]) for r in rows), 2),
        # after the first step: no start-up (the first batch is generated from nothing in every
        # mode), but async steps may still drain a backlog generated during the first one
        "after_first_tokens_per_s": (
            round(
                sum(int(r["tokens/policy"]) for r in rows[1:])
                / max(elapsed - float(rows[0]["time/elapsed_s"]), 1e-9),
                2,
            )
            if len(rows) > 1
            else None
        ),
        "curve": [
            [round(float(r["time/elapsed_s"]), 1), round(float(r["reward/mean"]), 4)] for r in rows
        ],
    }
    if monitor is not None and monitor.loop_start is not None:
        idle = monitor.idle_fractions(monitor.loop_start, monitor.loop_start + elapsed)
        out["generation_idle_frac"] = idle["generation"]
        out["learning_idle_frac"] = idle["learning"]
    return out


def plot(results: list[dict[str, Any]], directory: str | Path) -> list[Path]:
    """Reward vs time for every setting; throughput per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r.get("curve"):
            t, y = zip(*r["curve"], strict=True)
            ax.plot(t, y, marker="o", ms=3, label=r["setting"])
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("mean reward of the batch")
    ax.set_title("reward vs time: sync and async (same trained samples)")
    ax.legend()
    fig.tight_layout()
    reward_png = directory / "async_vs_sync_reward.png"
    fig.savefig(reward_png, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["setting"] for r in results if r.get("tokens_per_s")]
    values = [r["tokens_per_s"] for r in results if r.get("tokens_per_s")]
    bars = ax.bar(names, values, color=["#888"] + ["#3a7"] * (len(values) - 1))
    for bar, r in zip(bars, [r for r in results if r.get("tokens_per_s")], strict=True):
        label = f"{r.get('ratio_vs_sync', 1.0):.2f}x"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center")
    ax.set_ylabel("trained tokens / s")
    ax.set_title("throughput per staleness bound (ratio to sync above the bars)")
    fig.tight_layout()
    thr_png = directory / "async_vs_sync_throughput.png"
    fig.savefig(thr_png, dpi=110)
    plt.close(fig)
    return [reward_png, thr_png]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="default, tiny or a model directory")
    parser.add_argument("--env", default=WORKLOAD)
    parser.add_argument("--staleness", default="0,1,2,4,8", help="0 is the sync baseline")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--concurrent-groups", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per process (the hardware split)"
    )
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--busy-threshold", type=float, default=0.10, help="share of a core")
    parser.add_argument("--out", default="runs/async_vs_sync")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plots", default=None, help="write the PNGs into this directory")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every setting")
    args = parser.parse_args(argv)

    levels = [int(x) for x in args.staleness.split(",") if x != ""]
    result: dict[str, Any] = {
        "benchmark": "async_vs_sync",
        "machine": machine_info(),
        "args": vars(args),
        "trained_samples_per_setting": args.steps * args.groups_per_step * args.group_size,
    }
    runs = []
    for s in levels:
        print(f"running {'sync' if s == 0 else f'async, max_staleness={s}'} ...", flush=True)
        runs.append(run_setting(args, s))
    base = next((r for r in runs if r["staleness_bound"] == 0 and r.get("tokens_per_s")), None)
    header = (
        f"{'setting':10s} {'tok/s':>8s} {'samples/s':>9s} {'gen idle':>8s} {'learn idle':>10s}"
        f" {'(wait)':>7s} {'stale':>6s} {'reward':>7s} {'vs sync':>8s} {'wall s':>7s}"
        f" {'after step 1':>13s}"
    )
    print(header)
    for r in runs:
        if base and r.get("tokens_per_s"):
            r["ratio_vs_sync"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
            if r.get("after_first_tokens_per_s") and base.get("after_first_tokens_per_s"):
                r["after_first_ratio_vs_sync"] = round(
                    r["after_first_tokens_per_s"] / base["after_first_tokens_per_s"], 3
                )
            r["reward_vs_sync"] = round(r["reward_final"] - base["reward_final"], 4)
        if not r.get("steps"):
            print(f"{r['setting']:10s} no steps recorded (exit {r.get('exit_code')})")
            continue
        print(
            f"{r['setting']:10s} {r['tokens_per_s']:8.2f} {r['samples_per_s']:9.3f}"
            f" {_pct(r.get('generation_idle_frac')):>8s} {_pct(r.get('learning_idle_frac')):>10s}"
            f" {_pct(r.get('learner_wait_frac')):>7s} {r['staleness_mean']:6.2f}"
            f" {r['reward_final']:7.3f} {r.get('ratio_vs_sync', float('nan')):7.2f}x"
            f" {r['elapsed_s']:7.1f}"
            f" {r.get('after_first_ratio_vs_sync', float('nan')):12.2f}x"
        )
    result["runs"] = runs
    if args.plots:
        result["plots"] = [str(p) for p in plot(runs, args.plots)]
    write_json(args.json, result)
    return result


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


if __name__ == "__main__":
    main()
