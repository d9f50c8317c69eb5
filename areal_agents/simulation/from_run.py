"""A profile from a run's own metrics: what the learner, the push and the episodes cost there.

``metrics.jsonl`` (one object per step, ``trainers/metrics.py``) gives, per step, the training
time (``time/train_s``), the push (``time/sync_s``), the trained policy tokens
(``tokens/policy``), the episodes and their mean turns. From those:

- ``learner.step_s`` and ``learner.token_s``: least squares of training time on tokens (one
  distinct token count: all of it is ``step_s``);
- ``push_s``: the mean push, start to served (``time/push_s``; ``time/sync_s`` in runs that
  predate it), and ``push_learner_s``: the median time a push held the loop (``time/sync_s``);
- ``episode.tokens_per_turn``: trained tokens / (episodes x mean turns).

A step's metrics do not give the server's throughput at other concurrencies nor the length of
single episodes, so ``server`` and ``episode.turns`` stay the ``base`` profile's.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_agents.errors import ConfigError
from areal_agents.files import read_jsonl
from areal_agents.simulation.profile import LearnerProfile, Profile

__all__ = ["profile_from_rows", "profile_from_run"]

_KEYS = ("time/train_s", "time/sync_s", "tokens/policy", "episodes", "episode/turns_mean")


def profile_from_run(run_dir: str | Path, base: Profile) -> Profile:
    """``base`` with the learner, push and tokens per turn measured in ``run_dir``."""
    path = Path(run_dir) / "metrics.jsonl"
    return profile_from_rows(read_jsonl(path), base, str(path), Path(run_dir).name)


def profile_from_rows(
    rows: Sequence[Mapping[str, Any]], base: Profile, source: str, label: str
) -> Profile:
    """``base`` with the learner, push and tokens per turn of ``rows`` (a run's per-step
    metrics, as ``metrics.jsonl`` holds them, from ``source``), named ``base.name+label``."""
    for i, row in enumerate(rows):
        missing = [k for k in _KEYS if k not in row]
        if missing:
            raise ConfigError(f"{source}: step row {i} lacks {', '.join(missing)}")
    train = [float(r["time/train_s"]) for r in rows]
    tokens = [float(r["tokens/policy"]) for r in rows]
    turns = sum(float(r["episodes"]) * float(r["episode/turns_mean"]) for r in rows)
    if turns <= 0:
        raise ConfigError(f"{source}: no trained turns to derive a profile from")
    if len(set(tokens)) > 1:
        slope, intercept = statistics.linear_regression(tokens, train)
        token_s, step_s = max(0.0, slope), max(0.0, intercept)
        if slope < 0:  # noise: the time does not grow with tokens here
            step_s = statistics.fmean(train)
    else:
        token_s, step_s = 0.0, statistics.fmean(train)
    learner = LearnerProfile(step_s, token_s, base.learner.scaling_efficiency)
    held = [float(r["time/sync_s"]) for r in rows]
    whole = [float(r["time/push_s"]) for r in rows if float(r.get("time/push_s") or 0) > 0]
    push_s = statistics.fmean(whole or held)  # time/push_s: start to served, even overlapped
    episode = dataclasses.replace(base.episode, tokens_per_turn={sum(tokens) / turns: 1.0})
    return dataclasses.replace(
        base,
        name=f"{base.name}+{label}",
        learner=learner,
        episode=episode,
        push_s=push_s,
        push_learner_s=min(push_s, statistics.median(held)),
        sources={
            **base.sources,
            "learner": f"{source}: least squares of time/train_s on tokens/policy",
            "push_s": f"{source}: mean time/push_s (time/sync_s before it was recorded)",
            "push_learner_s": f"{source}: median time/sync_s (the time the push held the loop)",
            "episode.tokens_per_turn": f"{source}: tokens/policy / (episodes x turns_mean)",
        },
    )
