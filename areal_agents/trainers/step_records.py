"""What the training loop writes about each step and the run: a ``metrics.jsonl`` line, the
progress bar's note while the learner waits, the sampled transcripts and their viewer page, and
the one-line summary printed at the end.

>>> waiting_postfix({"buffer/ready": 0, "buffer/in_flight": 2})
'generating: 0 groups ready, 2 in flight'
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from areal_agents.files import read_jsonl
from areal_agents.trainers.buffer import Group

__all__ = [
    "assistant_turns",
    "print_summary",
    "sample_transcripts",
    "staleness_by_length",
    "step_metrics",
    "waiting_postfix",
    "write_transcript_viewer",
]


def waiting_postfix(stats: dict[str, float]) -> str:
    """The progress bar's note while the learner waits for a batch.

    >>> waiting_postfix({"buffer/ready": 0, "buffer/in_flight": 0})
    'starting: no group admitted yet (servers and rollout workers loading)'
    >>> waiting_postfix({"buffer/ready": 1, "buffer/in_flight": 3})
    'generating: 1 groups ready, 3 in flight'
    """
    ready, in_flight = int(stats["buffer/ready"]), int(stats["buffer/in_flight"])
    if ready == 0 and in_flight == 0:
        return "starting: no group admitted yet (servers and rollout workers loading)"
    return f"generating: {ready} groups ready, {in_flight} in flight"


def assistant_turns(mask: list[int] | tuple[int, ...]) -> int:
    """The assistant turns of an episode: the runs of 1s of its loss mask.

    >>> assistant_turns([0, 1, 1, 0, 0, 1, 0])
    2
    """
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


def staleness_by_length(trajs: list[Any], trained_version: int) -> dict[str, float]:
    """How stale the batch's episodes are by their length, to see whether the batch order or the
    admission rules train long episodes staler than short ones: ``staleness/turns<n>_mean`` (the
    mean over the episodes with ``n`` assistant turns of ``trained_version - min_version``) and
    ``batch/turns<n>_episodes`` (how many there are)."""
    ages: dict[int, list[int]] = {}
    for t in trajs:
        if t.min_version >= 0:
            age = trained_version - t.min_version
            ages.setdefault(assistant_turns(t.loss_mask), []).append(age)
    out: dict[str, float] = {}
    for n, values in sorted(ages.items()):
        out[f"staleness/turns{n}_mean"] = statistics.fmean(values)
        out[f"batch/turns{n}_episodes"] = float(len(values))
    return out


def step_metrics(
    step: int,
    groups: list[Group],
    learn: dict[str, float],
    buffer_stats: dict[str, float],
    times: dict[str, float],
) -> dict[str, Any]:
    """One line of ``metrics.jsonl``."""
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajs]
    policy_tokens = sum(t.num_policy_tokens for t in trajs)
    trained_version = step - 1  # the weights this batch was trained on
    staleness = [trained_version - t.min_version for t in trajs if t.min_version >= 0]
    return {
        "version": step,
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "reward/max": max(rewards),
        "episodes": len(trajs),
        "episode/truncated_frac": statistics.fmean(float(t.truncated) for t in trajs),
        "tokens/policy": policy_tokens,
        "tokens/total": sum(len(t.sequence_ids) for t in trajs),
        "staleness/max": max(staleness, default=0),
        "staleness/mean": statistics.fmean(staleness) if staleness else 0.0,
        **staleness_by_length(trajs, trained_version),
        "throughput/tokens_per_s": policy_tokens / max(times["step_s"], 1e-9),
        **{f"time/{k}": v for k, v in times.items()},
        **learn,
        **buffer_stats,
        "batch/task_indices": [g.task.index for g in groups],
        "batch/traj_ids": [t.metadata.traj_id for t in trajs],
        # per group: what was trained on and what it earned (benchmarks/rl_families)
        "batch/task_ids": [g.trajectories[0].task_id if g.trajectories else "" for g in groups],
        "batch/group_rewards": [g.rewards for g in groups],
    }


def sample_transcripts(groups: list[Group], n: int) -> list[dict[str, Any]]:
    """The first ``n`` transcripts of a batch (what ``transcripts.jsonl`` keeps per step)."""
    return [row for g in groups for row in g.transcripts][:n]


def write_transcript_viewer(run_dir: Path, summary: dict[str, Any]) -> None:
    """``transcripts.html``: the sampled episodes in the eval transcript viewer."""
    try:
        from areal_agents.eval_viewer import write_viewer
    except ImportError:  # the viewer ships with the eval command
        return
    records = read_jsonl(run_dir / "transcripts.jsonl", torn_ok=True)
    write_viewer(run_dir / "transcripts.html", records, {"pass_threshold": 1.0, **summary})


def print_summary(summary: dict[str, Any]) -> None:
    """The run's one-line summary (the closing screen follows it)."""
    keys = (
        "steps",
        "stop_reason",
        "final_version",
        "reward_first",
        "reward_last",
        "episodes",
        "dropped_episodes",
        "tokens_per_s_mean",
        "wall_s",
        "time_to_first_step_s",
        "run_dir",
    )
    print("summary: " + ", ".join(f"{k}={summary.get(k)}" for k in keys))
