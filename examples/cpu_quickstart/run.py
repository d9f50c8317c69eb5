"""The CPU quickstart, end to end: warm-start, evaluate, train with RL, evaluate again.

    python -m examples.cpu_quickstart.run                 # 1 seed, 15 minutes of RL
    python -m examples.cpu_quickstart.run --seeds 0,1,2   # the 3-seed measurement

1. ``warm_start``: a short supervised warm-start of SmolLM2-135M-Instruct on generated
   calculator demonstrations (once; reused by every seed).
2. Held-out evaluation of the warm-started model with ``python -m areal_agents.eval``.
3. Per seed: ``python -m areal_agents.train config=examples/cpu_quickstart/config.yaml
   model=<warm start> trainer.seed=<seed>``, stopped once the time budget is spent
   (``--budget-s``, 900 s of training by default, on the trainer's own clock, which starts once
   the server and learner are up).
4. The weights of the last step that ended within the budget (as pushed to the inference server)
   are evaluated on the same held-out tasks; the tasks the run trained on are checked against
   the held-out ones.

Writes ``runs/cpu_quickstart/`` (models, runs, evaluations), a JSON of every figure and a PNG of
reward vs time (``--json``, ``--plot``).

Every process runs torch with one thread (``OMP_NUM_THREADS=1`` unless set): on a 2-core machine
shared by a server, a learner and other jobs, two OpenMP threads per process spin against each
other, and a generation request was measured 5-10x slower than with one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_agents.files import read_jsonl
from examples.cpu_quickstart.evaluate import evaluate
from examples.cpu_quickstart.tasks import overlap_with_training
from examples.cpu_quickstart.warm_start import warm_start

__all__ = ["main", "train_for"]

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("config.yaml")


def _rows(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path, torn_ok=True)


def train_for(
    model: Path, run_dir: Path, seed: int, budget_s: float, extra: Sequence[str] = ()
) -> dict[str, Any]:
    """Train from ``model`` for ``budget_s`` of training time; returns the figures and the
    weights of the last step that ended within the budget (``final_model``)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    command = [
        sys.executable,
        "-m",
        "areal_agents.train",
        f"config={CONFIG}",
        f"model={model}",
        f"trainer.seed={seed}",
        f"output_dir={run_dir}",
        *extra,
    ]
    run_dir.mkdir(parents=True)
    started = time.perf_counter()
    metrics = run_dir / "metrics.jsonl"
    kept = run_dir / "within_budget"  # the weights of the last step that ended within budget
    kept_step, loop_start, stopped = 0, None, False
    with (run_dir / "train.log").open("wb") as log:
        proc = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        while proc.poll() is None:
            time.sleep(2)
            rows = _rows(metrics)
            if rows and loop_start is None:
                loop_start = time.monotonic() - float(rows[-1]["time/elapsed_s"])
            for row in rows:
                step = int(row["step"])
                if step > kept_step and float(row["time/elapsed_s"]) <= budget_s:
                    # version `step` was pushed before its line was written, and it is deleted
                    # only after the next push: copy it now
                    shutil.rmtree(kept, ignore_errors=True)
                    try:
                        shutil.copytree(run_dir / "weights" / f"v{step:06d}", kept)
                    except (FileNotFoundError, shutil.Error):  # already replaced: skip it
                        continue
                    kept_step = step
            over = loop_start is not None and time.monotonic() - loop_start > budget_s
            if over and not stopped:
                os.killpg(proc.pid, signal.SIGTERM)  # the trainer shuts its servers down
                stopped = True
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    rows = [r for r in _rows(metrics) if int(r["step"]) <= kept_step]
    if not rows:
        tail = (run_dir / "train.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"no training step ended within {budget_s} s (exit {code}):\n{tail}")
    last = kept_step
    final = run_dir / "final_model"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(model, final)  # tokenizer, template, config
    shutil.copy(kept / "model.safetensors", final / "model.safetensors")
    return {
        "seed": seed,
        "steps": last,
        "exit_code": code,
        "stopped_at_budget": stopped,
        "train_elapsed_s": round(float(rows[-1]["time/elapsed_s"]), 1),
        "process_wall_s": round(time.perf_counter() - started, 1),
        "episodes": sum(int(r["episodes"]) for r in rows),
        "curve": [
            [round(float(r["time/elapsed_s"]), 1), round(float(r["reward/mean"]), 4)] for r in rows
        ],
        "staleness_mean": round(sum(float(r["staleness/mean"]) for r in rows) / len(rows), 3),
        "final_model": str(final),
        "command": " ".join(command[1:]),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for run in result["runs"]:
        t, y = zip(*run["curve"], strict=True)
        ax1.plot(t, y, marker="o", ms=3, label=f"seed {run['seed']}")
    ax1.set_xlabel("training time (s)")
    ax1.set_ylabel("batch mean reward (training tasks)")
    ax1.set_title("RL on calculator, 2 CPU cores")
    ax1.legend()
    before = result["eval_before"]["success"]
    labels = ["warm start"] + [f"seed {r['seed']}" for r in result["runs"]]
    values = [before] + [r["eval_after"]["success"] for r in result["runs"]]
    ax2.bar(labels, values, color=["#888"] + ["#3a7"] * len(result["runs"]))
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("held-out success")
    ax2.set_title("held-out success before / after RL")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="runs/cpu_quickstart")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--budget-s", type=float, default=900.0, help="training time per seed")
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--warm-steps", type=int, default=8)
    parser.add_argument("--warm-direct-frac", type=float, default=0.5)
    parser.add_argument("--json", default="benchmarks/results/cpu_quickstart.json")
    parser.add_argument("--plot", default="benchmarks/plots/cpu_quickstart_reward.png")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for the trainer")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    sys.path.insert(0, str(REPO / "benchmarks"))
    from _common import machine_info, write_json

    root = Path(args.root).resolve()
    result: dict[str, Any] = {"benchmark": "cpu_quickstart", "machine": machine_info()}
    warm = root / "warm_start"
    if not (warm / "warm_start.json").is_file():
        print("warm-start ...", flush=True)
        warm_start(warm, steps=args.warm_steps, direct_frac=args.warm_direct_frac)
    result["warm_start"] = json.loads((warm / "warm_start.json").read_text())
    before_dir = root / "eval_before"
    if (before_dir / "summary.json").is_file():
        result["eval_before"] = json.loads((before_dir / "summary.json").read_text())
        result["eval_before"]["success"] = result["eval_before"]["mean_reward"]
    else:
        print("evaluating the warm-started model on held-out tasks ...", flush=True)
        result["eval_before"] = evaluate(warm, before_dir, tasks=args.eval_tasks)
    print(f"held-out success before RL: {result['eval_before']['success']:.3f}", flush=True)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    result["runs"] = []
    previous = Path(args.json)
    if previous.is_file():  # keep the runs of other seeds measured before (same warm start)
        old = json.loads(previous.read_text())
        if old.get("warm_start") == result["warm_start"]:
            result["runs"] = [r for r in old.get("runs", []) if r["seed"] not in seeds]
    for seed in seeds:
        print(f"seed {seed}: RL for {args.budget_s:.0f} s of training ...", flush=True)
        run = train_for(warm, root / f"rl_seed{seed}", seed, args.budget_s, args.extra)
        run["eval_after"] = evaluate(
            run["final_model"], root / f"eval_after_seed{seed}", tasks=args.eval_tasks
        )
        run["overlap"] = overlap_with_training(
            root / f"rl_seed{seed}" / "metrics.jsonl", seed, args.eval_tasks
        )
        run["gain_points"] = round(
            100 * (run["eval_after"]["success"] - result["eval_before"]["success"]), 1
        )
        result["runs"].append(run)
        print(
            f"seed {seed}: {run['steps']} steps in {run['train_elapsed_s']} s; held-out success "
            f"{result['eval_before']['success']:.3f} -> {run['eval_after']['success']:.3f} "
            f"({run['gain_points']:+.1f} points); trained on {run['overlap']['trained_tasks']} "
            f"tasks, {run['overlap']['heldout_overlap']} of them held out",
            flush=True,
        )
        write_json(args.json, result)
        plot(result, Path(args.plot))
    gains = [r["gain_points"] for r in result["runs"]]
    if gains:
        result["gain_points_mean"] = round(sum(gains) / len(gains), 1)
        print(f"mean gain over {len(gains)} seed(s): {result['gain_points_mean']:+.1f} points")
    write_json(args.json, result)
    if result["runs"]:
        plot(result, Path(args.plot))
    return result


if __name__ == "__main__":
    main()
