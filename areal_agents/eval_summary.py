"""The summary of an eval run: pass@k, tool-error rates, dropped and failed episodes, exit status.

``summary.json`` is :func:`summarize` of the finished episode records plus the run's counts
(``episodes_dropped`` with ``dropped_by_kind``, ``episodes_failed``, the endpoint client's
``endpoint`` counters); :func:`exit_status` turns it into the command's exit status.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_agents.eval_config import EvalConfig

__all__ = ["exit_status", "failure_line", "pass_at_k", "summarize"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator: 1 - C(n-c, k) / C(n, k) (n samples, c correct).

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 2)
    (0.25, 1.0, 0.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _ks(samples: int) -> list[int]:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= samples]
    return sorted({*ks, samples})


def summarize(
    records: Sequence[Mapping[str, Any]], cfg: EvalConfig, dropped: int
) -> dict[str, Any]:
    """The summary of finished episode records (as written to ``transcripts.jsonl``)."""
    n = len(records)
    by_task: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by_task[int(r["task_index"])].append(r)
    passes: dict[str, float] = {}
    for k in _ks(cfg.samples_per_task):
        values = [
            pass_at_k(len(rs), sum(r["reward"] >= cfg.pass_threshold for r in rs), k)
            for rs in by_task.values()
            if len(rs) >= k
        ]
        if values:
            passes[f"pass@{k}"] = sum(values) / len(values)
    errors: Counter[str] = Counter()
    for r in records:
        errors.update({kind: int(v) for kind, v in (r.get("tool_errors") or {}).items()})
    calls = sum(int(r.get("tool_calls", 0)) for r in records)
    attempts = calls + errors.get("parse", 0)  # parse failures never became calls

    def mean(key: str) -> float:
        return sum(float(r.get(key, 0) or 0) for r in records) / n if n else 0.0

    return {
        "env": cfg.env,
        "model": cfg.policy.model,
        "base_url": cfg.policy.base_url or "builtin",
        "episodes": n,
        "episodes_planned": cfg.num_episodes,
        "episodes_dropped": dropped,
        "tasks": len(by_task),
        "samples_per_task": cfg.samples_per_task,
        "sampling": {
            "temperature": cfg.temperature,
            "top_p": cfg.policy.top_p,
            "max_tokens": cfg.policy.max_tokens,
            "samples_per_task": cfg.samples_per_task,
        },
        "mean_reward": mean("reward"),
        **passes,
        "pass_threshold": cfg.pass_threshold,
        "turns_per_episode": mean("num_turns"),
        "completion_tokens_per_episode": mean("completion_tokens"),
        "tool_calls_per_episode": mean("tool_calls"),
        "malformed_tool_calls": sum(int(r.get("malformed_tool_calls", 0)) for r in records),
        "tool_call_attempts": attempts,
        "tool_error_rate": sum(errors.values()) / attempts if attempts else 0.0,
        "tool_error_rates": {
            k: v / attempts if attempts else 0.0 for k, v in sorted(errors.items())
        },
        "tool_errors": dict(sorted(errors.items())),
        "truncated_rate": sum(bool(r.get("truncated")) for r in records) / n if n else 0.0,
        "mean_duration_s": mean("duration_s"),
    }


def exit_status(summary: Mapping[str, Any]) -> int:
    """1 when episodes were planned but none finished, or any episode failed; else 0."""
    none_finished = summary.get("episodes_planned", 0) > 0 and summary.get("episodes", 0) == 0
    return 1 if none_finished or summary.get("episodes_failed", 0) else 0


def failure_line(summary: Mapping[str, Any]) -> str:
    planned, done = summary.get("episodes_planned", 0), summary.get("episodes", 0)
    dropped, failed = summary.get("episodes_dropped", 0), summary.get("episodes_failed", 0)
    first = (summary.get("failed") or summary.get("dropped") or [{}])[0].get("error", "")
    return (
        f"{done} of {planned} episodes finished ({dropped} dropped, {failed} failed); "
        f"first error: {str(first)[:300]}"
    )
