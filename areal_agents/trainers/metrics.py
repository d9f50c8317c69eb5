"""What a run records: ``metrics.jsonl`` (one object per step), TensorBoard, transcripts, summary.

On resume from checkpoint ``k`` the JSONL files are cut back to steps ``<= k`` and TensorBoard
purges later events, so the record of a resumed run reads like that of an uninterrupted one.
At the end, :func:`write_summary` writes ``summary.json`` and ``summary.png`` (reward and
throughput over time).

Every step also records the health of tool use and of the rollouts (:func:`health_metrics`):
the rate of each kind of tool-call mistake (``tools/error_rate/<kind>`` for every kind in
:data:`~areal_agents.envs.base.ERROR_KINDS`, zero included, so each curve is continuous), turns
per episode, and the share of the episodes finished since the last step that were dropped for
infrastructure faults (``episode/dropped_frac``). :func:`progress_postfix` puts the non-zero
ones on the progress bar.

>>> from areal_agents.types import Trajectory, TrajectoryMetadata
>>> t = Trajectory((1, 2), (0, 1), (0.0, -0.5), (-1, 0), reward=1.0, group_id="task0",
...     num_turns=2, metadata=TrajectoryMetadata(tool_calls=3, tool_errors={"parse": 1}))
>>> before = {"buffer/finished_episodes": 0, "buffer/dropped_episodes": 0}
>>> after = {"buffer/finished_episodes": 3, "buffer/dropped_episodes": 1}
>>> h = health_metrics([t], before, after)
>>> h["tools/error_rate/parse"], h["tools/error_rate/tool_failure"], h["episode/dropped_frac"]
(0.25, 0.0, 0.25)
>>> progress_postfix({"reward/mean": 0.5, "throughput/tokens_per_s": 12.0, **h})
{'reward': '0.500', 'tok_s': '12.0', 'stale': 0, 'tool_err': '0.25', 'parse': '0.25', \
'dropped': '0.25'}
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_agents.envs.base import ERROR_KINDS
from areal_agents.files import atomic_write, read_jsonl, write_json
from areal_agents.trainers.config import LogConfig
from areal_agents.trainers.report import tool_metrics
from areal_agents.types import Trajectory

__all__ = [
    "MetricsLogger",
    "health_metrics",
    "progress_postfix",
    "truncate_jsonl",
    "write_summary",
]

#: How the progress bar names each kind of tool-call mistake.
_SHORT_KINDS = {
    "parse": "parse",
    "unknown_tool": "unknown_tool",
    "invalid_arguments": "bad_args",
    "tool_failure": "tool_fail",
    "too_many_calls": "too_many",
    "time_budget": "timeout",
}


def health_metrics(
    trajectories: Sequence[Trajectory],
    buffer_before: Mapping[str, float],
    buffer_now: Mapping[str, float],
) -> dict[str, float]:
    """Tool-call and rollout health of one step.

    Args:
        trajectories: the step's batch.
        buffer_before: the buffer's :meth:`~areal_agents.trainers.buffer.TrajectoryBuffer.stats`
            after the previous step (or at the start of the run).
        buffer_now: the same after this step; the difference gives the episodes finished and
            dropped in between (a dropped episode never reaches a batch, so the batch alone
            cannot tell).

    Returns ``tools/calls_per_episode``, ``tools/error_rate`` and ``tools/error_rate/<kind>``
    (per tool-call attempt, see :func:`~areal_agents.trainers.report.tool_metrics`),
    ``episode/turns_mean`` and ``episode/turns_max``, ``episode/dropped`` and
    ``episode/dropped_frac`` (dropped over finished plus dropped, 0.0 when neither).
    """
    out = tool_metrics(t.metadata.to_dict() for t in trajectories)
    for kind in ERROR_KINDS:
        out.setdefault(f"tools/error_rate/{kind}", 0.0)
    turns = [t.num_turns for t in trajectories]
    out["episode/turns_mean"] = statistics.fmean(turns) if turns else 0.0
    out["episode/turns_max"] = float(max(turns, default=0))

    def delta(key: str) -> float:
        return float(buffer_now.get(key, 0.0)) - float(buffer_before.get(key, 0.0))

    dropped, finished = delta("buffer/dropped_episodes"), delta("buffer/finished_episodes")
    out["episode/dropped"] = dropped
    out["episode/dropped_frac"] = dropped / (dropped + finished) if dropped + finished else 0.0
    return out


def progress_postfix(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The progress bar's postfix for a step's metrics: reward, tokens/s and staleness always;
    the tool-error rates (all kinds, then each kind) and the dropped share only when non-zero."""
    out: dict[str, Any] = {
        "reward": f"{metrics['reward/mean']:.3f}",
        "tok_s": f"{metrics['throughput/tokens_per_s']:.1f}",
        "stale": int(metrics.get("staleness/max", 0)),
    }
    if metrics.get("tools/error_rate"):
        out["tool_err"] = f"{metrics['tools/error_rate']:.2f}"
    for kind in ERROR_KINDS:
        if rate := metrics.get(f"tools/error_rate/{kind}"):
            out[_SHORT_KINDS.get(kind, kind)] = f"{rate:.2f}"
    if metrics.get("episode/dropped_frac"):
        out["dropped"] = f"{metrics['episode/dropped_frac']:.2f}"
    return out


def truncate_jsonl(path: str | os.PathLike[str], max_step: int) -> None:
    """Keep only lines whose ``step`` is ``<= max_step`` (atomic rewrite)."""
    path = Path(path)
    if not path.is_file():
        return
    keep = [row for row in read_jsonl(path, torn_ok=True) if int(row.get("step", 0)) <= max_step]
    atomic_write(path, "".join(json.dumps(row) + "\n" for row in keep))


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


class MetricsLogger:
    """Appends step metrics and transcripts under ``run_dir``; mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, cfg: LogConfig, *, resume_step: int = 0) -> None:
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.transcripts_path = run_dir / "transcripts.jsonl"
        truncate_jsonl(self.metrics_path, resume_step)
        truncate_jsonl(self.transcripts_path, resume_step)
        if resume_step == 0:
            for p in (self.metrics_path, self.transcripts_path):
                p.unlink(missing_ok=True)
        self._metrics = open(self.metrics_path, "a")  # noqa: SIM115 - closed in close()
        self._transcripts = open(self.transcripts_path, "a")  # noqa: SIM115
        self._tb: Any = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)
        self._wandb: Any = None
        if cfg.wandb_project:
            try:
                import wandb
            except ImportError:
                from areal_agents.errors import DependencyError

                raise DependencyError(
                    "log.wandb_project is set but wandb is not installed: pip install wandb"
                ) from None
            self._wandb = wandb.init(project=cfg.wandb_project, dir=str(run_dir), resume="allow")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record the metrics of step ``step`` (flushed to disk at once)."""
        row = {"step": step, **metrics}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        os.fsync(self._metrics.fileno())
        scalars = {k: s for k, v in metrics.items() if (s := _scalar(v)) is not None}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def transcripts(self, step: int, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append sampled episode transcripts (the format ``eval`` writes, plus ``step``)."""
        for row in rows:
            self._transcripts.write(json.dumps({"step": step, **row}) + "\n")
        self._transcripts.flush()

    def close(self) -> None:
        self._metrics.close()
        self._transcripts.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def write_summary(run_dir: Path, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``summary.json`` and ``summary.png`` from ``metrics.jsonl``; return the summary."""
    rows = read_jsonl(run_dir / "metrics.jsonl", torn_ok=True)
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    summary: dict[str, Any] = {
        "steps": len(rows),
        "final_version": rows[-1].get("version") if rows else 0,
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "episodes": sum(int(r.get("episodes", 0)) for r in rows),
        "dropped_episodes": rows[-1].get("buffer/dropped_episodes", 0) if rows else 0,
        "tokens_per_s_mean": statistics.fmean(
            [r["throughput/tokens_per_s"] for r in rows if "throughput/tokens_per_s" in r] or [0.0]
        ),
        "wall_s": rows[-1].get("time/elapsed_s") if rows else 0.0,
        **(extra or {}),
    }
    write_json(run_dir / "summary.json", summary, indent=2)
    if rows:
        _plot(rows, run_dir / "summary.png")
    return summary


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r.get("time/elapsed_s", i) for i, r in enumerate(rows)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(t, [r.get("reward/mean", float("nan")) for r in rows], marker="o")
    ax1.set_xlabel("time (s)")
    ax1.set_ylabel("mean reward")
    ax1.set_title("reward")
    ax2.plot(t, [r.get("throughput/tokens_per_s", float("nan")) for r in rows], marker="o")
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("generated tokens / s")
    ax2.set_title("rollout throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
