"""Fairness accounting of the async vs sync benchmark: what each mode actually trained.

A throughput ratio is fair only if both modes trained episodes of the same length: a mode that
trains the short episodes and leaves the long ones untrained looks faster per token without
being faster. These functions read a run's ``metrics.jsonl`` rows and report

* :func:`trained_lengths`: the trained episodes' mean assistant turns and mean policy tokens;
* :func:`length_buckets`: how many trained episodes each task length (questions per dialogue
  of the long-tail workload) contributed, from the logged task indices;
* :func:`agreement`: each mode's relative difference from the baseline on those means, and
  whether all lie within the tolerance (5% by default);
* :func:`load_now`: the machine's load average at a moment (recorded around every run).

Hand-computable example: two steps of 4 episodes, 2.0 and 4.0 turns on average, 100 and 300
policy tokens: 8 episodes, 3.0 turns and 50.0 tokens per episode.

>>> rows = [{"episodes": 4, "episode/turns_mean": 2.0, "tokens/policy": 100},
...         {"episodes": 4, "episode/turns_mean": 4.0, "tokens/policy": 300}]
>>> trained_lengths(rows)
{'episodes': 8, 'turns_mean': 3.0, 'policy_tokens_mean': 50.0, 'policy_tokens': 400}
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "agreement",
    "held_out_ids",
    "length_buckets",
    "load_now",
    "task_rounds",
    "trained_lengths",
]


def trained_lengths(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Episodes trained, their mean assistant turns and mean policy tokens (episode-weighted)."""
    episodes = sum(int(r["episodes"]) for r in rows)
    turns = sum(float(r["episode/turns_mean"]) * int(r["episodes"]) for r in rows)
    tokens = sum(int(r["tokens/policy"]) for r in rows)
    return {
        "episodes": episodes,
        "turns_mean": round(turns / episodes, 4) if episodes else 0.0,
        "policy_tokens_mean": round(tokens / episodes, 4) if episodes else 0.0,
        "policy_tokens": tokens,
    }


def length_buckets(
    rows: Sequence[Mapping[str, Any]], rounds_of: Callable[[int], int], group_size: int
) -> dict[str, int]:
    """Trained episodes per task length: ``{"rounds=K": episodes}``, sorted by K.

    ``rounds_of`` maps a task index (``batch/task_indices`` of each row) to its length; every
    trained group contributes ``group_size`` episodes (a group that lost an episode to a drop
    still counts whole: drops are reported apart, in ``buffer/dropped_episodes``).
    """
    counts: dict[int, int] = {}
    for r in rows:
        for index in r.get("batch/task_indices", []):
            k = rounds_of(int(index))
            counts[k] = counts.get(k, 0) + group_size
    return {f"rounds={k}": counts[k] for k in sorted(counts)}


def held_out_ids(env_name: str, tasks: int) -> frozenset[str]:
    """The ids of the ``tasks`` held-out tasks a run of ``env_name`` never trains on (none: 0)."""
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig
    from areal_agents.trainers.held_out import held_out_task_ids

    # the benchmarks' runs score their last step (eval.validation_tasks=0): no validation ids
    overrides = [f"env={env_name}", f"eval.held_out_tasks={tasks}", "eval.validation_tasks=0"]
    cfg = load_config(TrainConfig, overrides)
    return held_out_task_ids(cfg) or frozenset()


def task_rounds(
    env_name: str, data_seed: int, indices: Sequence[int], held_out_ids: frozenset[str]
) -> dict[int, int]:
    """The number of questions of each trained task of the long-tail workload, as the rollout
    worker drew it: the task seed of ``(data_seed, index)``, moved off held-out tasks."""
    from gymnasium.utils import seeding

    from areal_agents.envs.registry import make_env
    from areal_agents.trainers.data import avoid_tasks, task_seed

    env = make_env(env_name)
    try:
        sample = env.unwrapped.sample_task  # type: ignore[attr-defined]
        out = {}
        for i in sorted(set(indices)):
            seed = avoid_tasks(env, task_seed(data_seed, i), held_out_ids)
            task = sample(seeding.np_random(int(seed))[0])
            out[i] = int(task.metadata.get("rounds", 1))
        return out
    finally:
        env.close()


def agreement(
    runs: Mapping[str, Mapping[str, float]],
    baseline: str = "sync",
    keys: Sequence[str] = ("turns_mean", "policy_tokens_mean"),
    tolerance: float = 0.05,
) -> dict[str, Any]:
    """Relative difference of each run's ``keys`` from the baseline run's, and whether every
    one is within ``tolerance`` (``|x / base - 1| <= tolerance``).

    >>> agreement({"sync": {"turns_mean": 4.0}, "async": {"turns_mean": 4.1}}, keys=["turns_mean"])
    {'tolerance': 0.05, 'diff': {'async': {'turns_mean': 0.025}}, 'within': True}
    >>> agreement({"sync": {"turns_mean": 4.0}, "async": {"turns_mean": 3.5}}, keys=["turns_mean"])
    {'tolerance': 0.05, 'diff': {'async': {'turns_mean': -0.125}}, 'within': False}
    """
    base = runs[baseline]
    diff: dict[str, dict[str, float]] = {}
    for name, run in runs.items():
        if name == baseline:
            continue
        diff[name] = {k: round(float(run[k]) / float(base[k]) - 1.0, 4) for k in keys}
    within = all(abs(v) <= tolerance + 1e-12 for d in diff.values() for v in d.values())
    return {"tolerance": tolerance, "diff": diff, "within": within}


def load_now() -> dict[str, Any]:
    """The load average (1, 5, 15 min) and the time, for the record around a run."""
    return {
        "time": time.strftime("%H:%M:%S"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
