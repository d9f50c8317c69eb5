"""benchmarks/restart_cost.py derives its figures from a run's records (its runs, which kill a
server, a worker and a learner, are the integration tests' own: tests/trainers/test_faults.py).
"""

from __future__ import annotations

import doctest
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import restart_cost


def row(step: int, tasks: list[int], step_s: float) -> dict:
    return {
        "step": step,
        "batch/task_indices": tasks,
        "batch/traj_ids": [f"t{i}-{j}" for i in tasks for j in range(2)],
        "time/step_s": step_s,
    }


def test_the_doctests_hold() -> None:
    assert doctest.testmod(restart_cost).failed == 0


def test_accounting_is_exact_only_with_every_step_and_task_once() -> None:
    rows = [row(1, [0, 1], 1.0), row(2, [2, 3], 1.0)]
    assert restart_cost.exact_accounting(rows, steps=2, groups=2)
    assert not restart_cost.exact_accounting(rows[:1], steps=2, groups=2)  # a step lost
    assert not restart_cost.exact_accounting([row(1, [0, 1], 1), row(2, [1, 3], 1)], 2, 2)
    twice = [rows[0], {**rows[1], "batch/traj_ids": rows[0]["batch/traj_ids"]}]
    assert not restart_cost.exact_accounting(twice, steps=2, groups=2)


def test_a_restart_is_read_from_faults_jsonl_and_the_steps_after_it() -> None:
    event = {"kind": "server", "at": 110.5, "step": 2, "requeued": 1, "restart_s": 4.25}
    rows = [row(1, [0, 1], 2.0), row(2, [2, 3], 1.0), row(3, [4, 5], 7.0), row(4, [6, 7], 1.0)]
    figures = restart_cost.summarize("server", [event], rows, killed_at=100.0)
    assert figures == {
        "restart_s": 4.25,
        "kill_to_record_s": 10.5,
        "at_step": 2,
        "requeued_groups": 1,
        "stalled_step_s": 7.0,  # the step that waited for the server
        "median_step_s": 1.5,
    }
    with pytest.raises(ValueError, match="expected one learner restart"):
        restart_cost.summarize("learner", [event], rows, killed_at=100.0)
    with pytest.raises(ValueError, match="expected one server restart"):
        restart_cost.summarize("server", [event, event], rows, killed_at=100.0)


def test_each_kind_runs_the_faults_test_command() -> None:
    learner = restart_cost.run_args("learner", Path("run"))
    server = restart_cost.run_args("server", Path("run"))
    assert "trainer.learner_ranks=2" in learner and "trainer.learner_ranks=2" not in server
    assert {"model=tiny", "env=calculator", "output_dir=run"} <= set(server)
    assert set(restart_cost.VICTIMS) == set(restart_cost.KINDS)
