"""What a run records: ``metrics.jsonl`` (one object per step), TensorBoard, transcripts, summary.

On resume from checkpoint ``k`` the JSONL files are cut back to steps ``<= k`` and TensorBoard
purges later events, so the record of a resumed run reads like that of an uninterrupted one.
At the end, :func:`write_summary` writes ``summary.json`` and ``summary.png`` (reward and
throughput over time).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from areal_agents.files import atomic_write, read_jsonl, write_json
from areal_agents.trainers.config import LogConfig

__all__ = ["MetricsLogger", "truncate_jsonl", "write_summary"]


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
