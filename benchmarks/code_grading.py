"""Latency of one unit-test grade (:class:`~areal_agents.rewards.UnitTestReward`) per backend.

    python benchmarks/code_grading.py [--backends docker bubblewrap] [--grades 20] [--json PATH]

Each grade is one judge round on the host, one sandbox run of the executor, and a second judge
round that decides (see :mod:`areal_agents.rewards._unit_tests`).

For each backend, grades in one warm sandbox (reset before each grade, as the code environment
does): the canonical solution of procedural tasks (right), the same tasks with a wrong
solution, and the canonical solutions of the first HumanEval problems. Prints the median, the
90th percentile and the mean of the wall time of ``reward.check`` for each kind, and the reward mean
(a correct grader gives 1.0, 0.0, 1.0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import latency, machine_info, write_json

from areal_agents.envs.tasks.code import ProceduralCodeTasks, humaneval_tasks
from areal_agents.rewards import UnitTestReward, UnitTests
from areal_agents.sandboxes import make_sandbox


def measure(backend: str, grades: int) -> dict[str, Any]:
    """The figures of one backend (see the module docstring)."""
    source = ProceduralCodeTasks()
    keys = [t.key for t in source.templates]
    procedural = [source.make(keys[i % len(keys)], i) for i in range(grades)]
    humaneval = list(humaneval_tasks())[:grades]
    reward = UnitTestReward()
    out: dict[str, Any] = {}
    with make_sandbox(backend) as sb:
        reward.check("def f():\n    return 1", UnitTests(tests=("assert f() == 1",)), sandbox=sb)
        kinds = {
            "procedural_right": [(t.metadata["canonical_solution"], t) for t in procedural],
            "procedural_wrong": [
                (
                    t.metadata["canonical_solution"]
                    + f"\n\ndef {t.metadata['entry_point']}(*args, **kwargs):\n    return None\n",
                    t,
                )
                for t in procedural
            ],
            "humaneval_right": [(t.metadata["canonical_solution"], t) for t in humaneval],
        }
        for kind, items in kinds.items():
            times, rewards = [], []
            for code, task in items:
                tests = UnitTests.from_mapping(task.metadata)
                start = time.perf_counter()
                result = reward.check(code, tests, sandbox=sb)
                times.append(time.perf_counter() - start)
                rewards.append(result.reward)
            out[kind] = {
                **latency(times, "ms", 1),
                "mean_reward": round(statistics.fmean(rewards), 3),
            }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark (see the module docstring); returns what it printed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["docker", "bubblewrap"])
    parser.add_argument("--grades", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"machine": machine_info()}
    for backend in args.backends:
        result[backend] = measure(backend, args.grades)
        for kind, figures in result[backend].items():
            print(f"{backend:10s} {kind:18s} {figures}")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
