"""Calibration on the fair benchmark: the simulator against the placed sync and async runs.

    PYTHONPATH=. python benchmarks/sim_calibration_fair.py   # prints the table, writes the JSON

Every run of the fair 3-seed benchmark (``results/async_vs_sync_fair_placed.json``, benchmarks
README section 2, Run F) is simulated with its own settings (steps, groups per step, group size,
groups in flight, staleness bound, seed; the weight push overlapping the next step, as the
trainer does) on the profile of its placement:

- sync on ``cpu_2core_vllm_colocated``: vLLM on both cores, then the learner on two threads;
- async on ``cpu_2core_vllm_split``: vLLM and the rollouts on one core, the learner on the other.

Each profile's server curve is the engine's throughput measured apart, on that placement
(``results/env_step_placement.json``, no efficiency fitted); its learner and push times come from
the seed-0 run of its mode (``profile_from_run`` on that run's steps). So the seed-0 rows are
fitted in part, and seeds 1 and 2 are predictions. Episodes replay the run's own tasks: each
task's questions come from its task seed, turned into turns and tokens with the run's measured
turns per question and tokens per turn (how long the policy's answers were is an input: the
simulator predicts when samples are trained, not what the model writes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fair import held_out_ids, task_rounds
from sim_calibration import RESULTS, TOLERANCE, print_rows, with_errors

from areal_agents.simulation import (
    EpisodeShape,
    Profile,
    ShapeFn,
    SimConfig,
    load_profile,
    profile_from_rows,
    simulate,
)
from areal_agents.trainers.data import TaskRef

__all__ = ["calibrate_fair", "run_shape"]

FAIR = RESULTS / "async_vs_sync_fair_placed.json"
PROFILES = {"sync": "cpu_2core_vllm_colocated", "async": "cpu_2core_vllm_split"}


def run_shape(run: dict[str, Any], rounds: dict[int, int]) -> ShapeFn:
    """Task ``i`` of the run as the simulator's episode: ``rounds[i]`` questions, at the run's
    measured turns per question and tokens per turn."""
    trained = [rounds[i] for step in run["per_step"] for i in step["batch/task_indices"]]
    per_question = float(run["turns_mean"]) / statistics.fmean(trained)
    tokens = max(1, round(float(run["policy_tokens_mean"]) / float(run["turns_mean"])))

    def shape(ref: TaskRef, sample: int) -> EpisodeShape:
        turns = max(1, round(per_question * rounds.get(ref.index, 1)))
        return EpisodeShape((tokens,) * turns)

    return shape


def _profile_of(run: dict[str, Any], base: Profile) -> Profile:
    """``base`` with the learner and push of ``run`` (its per-step figures)."""
    fitted = profile_from_rows(run["per_step"], base, f"run {run['setting']}", run["setting"])
    # profile_from_rows also takes the run's tokens per turn: the replay sets the episodes
    return dataclasses.replace(fitted, episode=base.episode, name=base.name)


def calibrate_fair(path: Path = FAIR) -> list[dict[str, Any]]:
    """One row per run of the fair benchmark in ``path``: measured against predicted."""
    data = json.loads(path.read_text())
    args = data["args"]
    runs = [r for r in data["runs"] if r.get("steps")]
    base = {mode: load_profile(name) for mode, name in PROFILES.items()}
    fitted_on = {}
    for mode in PROFILES:
        first = min((r for r in runs if _mode(r) == mode), key=lambda r: int(r["seed"]))
        fitted_on[mode] = first["setting"]
        base[mode] = _profile_of(first, base[mode])
    held = held_out_ids(args["env"], int(args["held_out"]))
    # the tasks a run trains, and room for the groups the simulator admits past them (its
    # buffer has no total: it starts groups that the run's end leaves untrained)
    indices = list(range(int(args["steps"]) * int(args["groups_per_step"]) + 64))
    rounds_of = {
        seed: task_rounds(args["env"], seed, indices, held)
        for seed in sorted({int(r["seed"]) for r in runs})
    }
    rows = []
    for run in runs:
        mode, seed = _mode(run), int(run["seed"])
        cfg = SimConfig(
            mode=mode,
            max_staleness=int(run["staleness_bound"]),
            groups_per_step=int(args["groups_per_step"]),
            group_size=int(args["group_size"]),
            steps=int(args["steps"]),
            concurrent_groups=int(args["concurrent_groups"]),
            seed=seed,
        )
        sim = simulate(base[mode], cfg, run_shape(run, rounds_of[seed]))
        rows.append(
            {
                "run": f"F {run['setting']}",
                "profile": base[mode].name,
                "fitted": run["setting"] == fitted_on[mode],
                "measured": {
                    "elapsed_s": run["elapsed_s"],
                    "tokens_per_s": run["tokens_per_s"],
                    "samples_per_s": run["samples_per_s"],
                    "turns_mean": run["turns_mean"],
                },
                "predicted": {
                    "elapsed_s": round(sim.elapsed_s, 1),
                    "tokens_per_s": round(sim.tokens_per_s, 3),
                    "samples_per_s": round(sim.samples_per_s, 4),
                    "turns_mean": round(sim.turns_mean, 2),
                },
            }
        )
    return with_errors(rows, ("elapsed_s", "samples_per_s", "tokens_per_s"))


def _mode(run: dict[str, Any]) -> Literal["sync", "async"]:
    return "sync" if int(run["staleness_bound"]) == 0 else "async"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(FAIR))
    parser.add_argument("--json", default=str(RESULTS / "sim_calibration_fair.json"))
    args = parser.parse_args()
    rows = calibrate_fair(Path(args.results))
    print_rows(rows)
    out_of_sample = [r for r in rows if not r["fitted"]]
    ok = sum(r["within_15pct"] for r in out_of_sample)
    print(f"predictions (seeds not fitted): {ok} of {len(out_of_sample)} within 15%")
    out = {
        "benchmark": "sim_calibration_fair",
        "results": Path(args.results).name,
        "profiles": PROFILES,
        "tolerance": TOLERANCE,
        "judged_on": ["elapsed_s", "samples_per_s", "tokens_per_s"],
        "within_out_of_sample": ok,
        "runs": rows,
    }
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
