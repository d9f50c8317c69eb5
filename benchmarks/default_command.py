"""The main command on its embedded defaults: held-out success before/after, per seed.

Runs ``python -m areal_agents.train env=ENV trainer.seed=S output_dir=...`` (nothing else
changed) for each seed, samples the machine's load average every 30 s while it runs, and
writes ``benchmarks/results/default_command_<tag>.json`` (held-out success of the base model,
after the warm start and after RL; steps; times; run-directory size; load) and the reward curves
``benchmarks/plots/default_command_<env>.png``. ``--collect DIR`` only reads a finished run.

    python -m benchmarks.default_command --seeds 0,1,2
    python -m benchmarks.default_command --env math_python --seeds 0
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_agents.files import read_json, read_jsonl, write_json

__all__ = ["collect", "main", "plot", "run_one"]

ROOT = Path(__file__).resolve().parent.parent


def _success(held: dict[str, Any], key: str) -> float | None:
    value = (held.get(key) or {}).get("success")
    return None if value is None else float(value)


def collect(run_dir: Path, load: Sequence[Sequence[float]] = ()) -> dict[str, Any]:
    """The figures of a finished run in ``run_dir`` (its ``summary.json`` and metrics)."""
    summary = read_json(run_dir / "summary.json")
    held = summary.get("held_out") or {}
    base, before, after = (_success(held, k) for k in ("base", "before", "after"))
    start = base if base is not None else before
    rows = (
        read_jsonl(run_dir / "metrics.jsonl", torn_ok=True)
        if (run_dir / "metrics.jsonl").is_file()
        else []
    )

    def points(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(100 * (b - a), 1)

    loads = [float(x[1]) for x in load]
    return {
        "env": summary.get("env"),
        "model": summary.get("model"),
        "held_out": {
            "tasks": held.get("tasks"),
            "seed": held.get("seed"),
            "base": base,
            "before_rl": before,
            "after_warm_start": before if base is not None else None,
            "after_rl": after,
            "gain_points": points(start, after),
            "warm_start_gain_points": points(base, before),
            "rl_gain_points": points(before, after),
            # the final policy chosen on validation tasks, and RL's last step where it was not
            "selection": held.get("selection"),
            "last_step": _success(held, "last"),
            "rl_gain_last_points": points(before, _success(held, "last")),
        },
        "warm_start": summary.get("warm_start"),
        "steps": summary.get("steps"),
        "stop_reason": summary.get("stop_reason"),
        "training_s": summary.get("training_s"),  # what the budget counts: warm start + RL
        "rl_wall_s": summary.get("wall_s"),
        "time_to_first_step_s": summary.get("time_to_first_step_s"),
        "time_to_first_step_without_eval_s": summary.get("time_to_first_step_without_eval_s"),
        "startup": summary.get("startup"),
        "times": summary.get("times"),
        "disk_mb": summary.get("disk_mb"),
        "reward_curve": [
            [round(float(r["time/elapsed_s"]), 1), round(float(r["reward/mean"]), 4)] for r in rows
        ],
        "load_average_1m": {
            "samples": [list(x) for x in load],
            "mean": round(sum(loads) / len(loads), 2) if loads else None,
            "max": max(loads) if loads else None,
        },
        "machine": {"cpus": os.cpu_count()},
    }


def run_one(env: str, seed: int, out_dir: Path, timeout_s: float = 3600) -> dict[str, Any]:
    """Run the default command for ``env`` and ``seed`` into ``out_dir``; its figures."""
    load: list[tuple[float, float]] = []
    done = threading.Event()
    start = time.time()

    def sample() -> None:
        while not done.wait(30.0):
            load.append((round(time.time() - start), os.getloadavg()[0]))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    command = [
        sys.executable,
        "-m",
        "areal_agents.train",
        f"env={env}",
        f"trainer.seed={seed}",
        f"output_dir={out_dir}",
        "log.progress=false",
    ]
    try:
        subprocess.run(command, cwd=ROOT, check=True, timeout=timeout_s)
    finally:
        done.set()
    result = collect(out_dir, load)
    result["command"] = " ".join(command[1:])
    result["seed"] = seed
    return result


def plot(results: Sequence[dict[str, Any]], path: Path) -> None:
    """Training reward against time per seed, and held-out success (base, warm, after)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for r in results:
        if r["reward_curve"]:
            t, y = zip(*r["reward_curve"], strict=True)
            ax1.plot(t, y, marker="o", ms=3, label=f"seed {r.get('seed')}")
    ax1.set_xlabel("training time (s)")
    ax1.set_ylabel("batch mean reward (training tasks)")
    ax1.set_title(f"default command, env={results[0]['env']}, 2 shared CPU cores")
    if any(r["reward_curve"] for r in results):
        ax1.legend()
    labels, values = [], []
    for r in results:
        held = r["held_out"]
        for name, key in (("base", "base"), ("warm", "after_warm_start"), ("RL", "after_rl")):
            if held.get(key) is not None:
                labels.append(f"s{r.get('seed')} {name}")
                values.append(held[key])
    ax2.bar(labels, values, color="#3a7")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("held-out success")
    ax2.tick_params(axis="x", labelrotation=60)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="code_sandbox")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--root", default="runs/default_command")
    parser.add_argument("--collect", default=None, help="read a finished run directory only")
    parser.add_argument("--load", default=None, help="with --collect: a file of 'T LOAD' lines")
    parser.add_argument(
        "--tag", default=None, help="results and plot file name (default: env and seed; env)"
    )
    args = parser.parse_args(argv)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        if args.collect:
            load = []
            if args.load:
                for line in Path(args.load).read_text().splitlines():
                    t, value = line.split()[:2]
                    load.append((float(t), float(value)))
            result = collect(Path(args.collect), load)
            result["seed"] = seed
            result["command"] = f"python -m areal_agents.train env={args.env} trainer.seed={seed}"
        else:
            out = Path(args.root) / f"{args.env}-seed{seed}"
            result = run_one(args.env, seed, out)
        tag = args.tag or (
            f"seed{seed}" if args.env == "code_sandbox" else f"{args.env}_seed{seed}"
        )
        write_json(ROOT / "benchmarks" / "results" / f"default_command_{tag}.json", result)
        results.append(result)
        held, trained = result["held_out"], (result["training_s"] or {}).get("total")
        print(
            f"{args.env} seed {seed}: held-out {held['base']} -> {held['after_warm_start']} "
            f"(warm start) -> {held['after_rl']} (RL); {result['steps']} steps; training "
            f"{trained} s; load {result['load_average_1m']['mean']}"
        )
    # a tagged run's plot is named by its tag too, so that it does not replace the env's
    plot(results, ROOT / "benchmarks" / "plots" / f"default_command_{args.tag or args.env}.png")
    return results


if __name__ == "__main__":
    main()
