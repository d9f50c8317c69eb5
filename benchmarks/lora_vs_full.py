"""LoRA against full fine-tuning on the quickstart task, for the same training time.

Each setting is one run of the quickstart's RL command (``examples/cpu_quickstart/config.yaml``,
from the warm-started model), stopped by the trainer itself once ``--budget-s`` seconds of
training are spent (``trainer.time_budget_s``), with the trainer's own held-out evaluation before
the first step and after the last (``eval.held_out_tasks`` tasks from ``eval.seed``, sampled at
temperature 1.0 as the quickstart's own evaluation does, since greedily its warm start already
answers 95% of them; against the run's inference server: with LoRA, the base plus the pushed
adapter). The settings
run one after the other, so the load of the shared machine may differ between them: it is
recorded with each (load average before and after, what else ran).

    python -m examples.cpu_quickstart.warm_start          # once: runs/cpu_quickstart/warm_start
    python benchmarks/lora_vs_full.py --budget-s 600 --json benchmarks/results/lora_vs_full.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, other_load, write_json

__all__ = ["SETTINGS", "main", "run_setting", "summarise"]

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "cpu_quickstart" / "config.yaml"
HELD_OUT_SEED = 900_000_000  # the quickstart's held-out seeds: no demonstration uses them

SETTINGS: dict[str, list[str]] = {
    "full": [],
    # LoRA's usual learning rate is ~10x full fine-tuning's (the quickstart uses 2e-5)
    "lora_r16": ["model.lora.r=16", "model.lora.alpha=32", "trainer.lr=2e-4"],
}


def summarise(run_dir: Path) -> dict[str, Any]:
    """The figures of one finished run, from its ``summary.json`` and ``metrics.jsonl``."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    held = summary.get("held_out") or {}
    before = (held.get("before") or {}).get("success")
    after = (held.get("after") or {}).get("success")
    return {
        "steps": len(rows),
        "stop_reason": summary.get("stop_reason"),
        "train_elapsed_s": round(float(rows[-1]["time/elapsed_s"]), 1) if rows else 0.0,
        "episodes": sum(int(r["episodes"]) for r in rows),
        "curve": [
            [round(float(r["time/elapsed_s"]), 1), round(float(r["reward/mean"]), 4)] for r in rows
        ],
        "median_train_s": _median([float(r["time/train_s"]) for r in rows]),
        "median_sync_s": _median([float(r["time/sync_s"]) for r in rows]),
        "held_out_tasks": held.get("tasks"),
        "held_out_before": before,
        "held_out_after": after,
        "gain_points": None
        if before is None or after is None
        else round(100 * (float(after) - float(before)), 1),
    }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[len(ordered) // 2], 3)


def run_setting(
    name: str,
    overrides: Sequence[str],
    model: Path,
    root: Path,
    *,
    budget_s: float,
    held_out: int,
    seed: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Run one setting to its end (time budget, then the held-out evaluation)."""
    run_dir = root / name
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "areal_agents.train",
        f"config={CONFIG}",
        f"model={model}",
        f"trainer.seed={seed}",
        f"output_dir={run_dir}",
        f"trainer.time_budget_s={budget_s}",
        f"eval.held_out_tasks={held_out}",
        f"eval.seed={HELD_OUT_SEED}",
        "eval.temperature=1.0",  # as the quickstart measures: its warm start is right greedily
        "eval.validation_tasks=0",  # what each last step learnt, not a choice among steps
        *overrides,
    ]
    load_before, others = os.getloadavg(), other_load()
    started = time.perf_counter()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with (root / f"{name}.log").open("wb") as log:
        code = subprocess.run(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
        ).returncode
    if code != 0:
        tail = (root / f"{name}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{name}: the trainer exited with {code}:\n{tail}")
    result = summarise(run_dir)
    result.update(
        {
            "overrides": list(overrides),
            "command": " ".join(command[1:]),
            "process_wall_s": round(time.perf_counter() - started, 1),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "others_at_start": others,
        }
    )
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/cpu_quickstart/warm_start")
    parser.add_argument("--root", default="runs/lora_vs_full")
    parser.add_argument("--budget-s", type=float, default=600.0, help="training time per setting")
    parser.add_argument("--held-out", type=int, default=64, help="held-out tasks per evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # see benchmarks/README.md: one thread each
    model = Path(args.model).resolve()
    result: dict[str, Any] = {
        "benchmark": "lora_vs_full",
        "machine": machine_info(),
        "args": vars(args),
        "runs": {},
    }
    for name in args.settings.split(","):
        print(f"{name}: {args.budget_s:.0f} s of training ...", flush=True)
        run = run_setting(
            name,
            SETTINGS[name],
            model,
            Path(args.root).resolve(),
            budget_s=args.budget_s,
            held_out=args.held_out,
            seed=args.seed,
            timeout_s=args.budget_s + 1800,
        )
        result["runs"][name] = run
        print(
            f"  {name}: {run['steps']} steps in {run['train_elapsed_s']} s, held-out "
            f"{run['held_out_before']} -> {run['held_out_after']} ({run['gain_points']} "
            f"points), median train {run['median_train_s']} s, push {run['median_sync_s']} s, "
            f"load {run['loadavg_before'][0]} -> {run['loadavg_after'][0]}",
            flush=True,
        )
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
