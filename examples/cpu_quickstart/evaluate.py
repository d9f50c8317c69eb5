"""Held-out success rate of a model on the calculator environment, by ``areal_agents.eval``.

Runs ``python -m areal_agents.eval`` (built-in server on the model directory, chat endpoint,
structured tool calls) on the held-out tasks of :mod:`examples.cpu_quickstart.tasks`: task
``i`` is ``reset(seed=HELDOUT_SEED0 + i)``, seeds no warm-start demonstration uses and that the
RL run is checked against. Temperature 1.0 samples as training does; 0 is greedy.

    python -m examples.cpu_quickstart.evaluate --model runs/cpu_quickstart/warm_start --tasks 64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.cpu_quickstart.tasks import HELDOUT_SEED0

__all__ = ["eval_command", "evaluate", "main"]

REPO = Path(__file__).resolve().parents[2]


def eval_command(
    model: str | Path,
    output_dir: str | Path,
    *,
    tasks: int = 64,
    temperature: float = 1.0,
    max_tokens: int = 48,
    concurrency: int = 16,
    max_turns: int = 2,
) -> list[str]:
    """The ``python -m areal_agents.eval`` command line for the held-out tasks."""
    return [
        sys.executable,
        "-m",
        "areal_agents.eval",
        "env=calculator",
        f"env_kwargs={{max_turns: {max_turns}}}",
        f"policy.model={model}",
        f"policy.temperature={temperature}",
        f"policy.max_tokens={max_tokens}",
        f"seed={HELDOUT_SEED0}",
        f"num_episodes={tasks}",
        "samples_per_task=1",
        f"concurrency={concurrency}",
        f"output_dir={output_dir}",
        "overwrite=true",  # a re-measurement replaces the earlier one (eval refuses otherwise)
        "progress=false",
    ]


def evaluate(
    model: str | Path,
    output_dir: str | Path,
    *,
    tasks: int = 64,
    temperature: float = 1.0,
    max_tokens: int = 48,
    concurrency: int = 16,
) -> dict[str, Any]:
    """Run the evaluation; returns its ``summary.json`` plus the wall time."""
    command = eval_command(
        model,
        output_dir,
        tasks=tasks,
        temperature=temperature,
        max_tokens=max_tokens,
        concurrency=concurrency,
    )
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"areal_agents.eval failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary: dict[str, Any] = json.loads((Path(output_dir) / "summary.json").read_text())
    summary["success"] = summary["mean_reward"]
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    summary["temperature"] = temperature
    summary["command"] = " ".join(command[1:])
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory")
    parser.add_argument("--out", default="runs/cpu_quickstart/eval")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    summary = evaluate(
        args.model,
        args.out,
        tasks=args.tasks,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
    )
    keys = ("success", "tool_calls_per_episode", "turns_per_episode", "episodes", "wall_s")
    print(json.dumps({k: summary.get(k) for k in keys}))
    return summary


if __name__ == "__main__":
    main()
