"""One page per run: ``runs/<name>/report.html``, static, readable offline, refreshed every step.

:func:`write_report` reads what the run has recorded (``metrics.jsonl``, ``transcripts.jsonl``,
``config.yaml``, ``summary.json`` once the run has ended) and writes one self-contained HTML
file: curves over steps or over time (reward, held-out success when measured, tokens/s,
staleness, idle fractions, tool-call error rates, step time split into generate/wait, train and
push), the run's configuration, and the transcript viewer of ``python -m areal_agents.eval``
(``areal_agents/eval_viewer.html``) with its filters, here also by step and status. The charts
are inline SVG drawn by a short script in the page: no server, no network, no library. While the
run goes on, the page reloads itself every ``refresh_s`` seconds (``#refresh=0`` turns it off);
filters and the x axis are kept in the URL fragment.

The trainer calls :func:`write_report` after every step and at the end; the file is replaced
atomically, so a browser or a watcher never reads half of it. :func:`tool_metrics` gives the
tool-call counts the error-rate chart plots.

>>> tool_metrics([{"tool_calls": 3, "tool_errors": {"parse": 1, "unknown_tool": 1}}])
{'tools/calls_per_episode': 3.0, 'tools/error_rate': 0.5, 'tools/error_rate/parse': 0.25, \
'tools/error_rate/unknown_tool': 0.25}
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from areal_agents.files import atomic_write, read_jsonl

__all__ = ["REPORT_TEMPLATE", "refresh_report", "render_report", "tool_metrics", "write_report"]

logger = logging.getLogger(__name__)

#: The report's own part of the page (styles, charts, configuration); the rest is the viewer.
REPORT_TEMPLATE = Path(__file__).with_name("report.html")
_SLOT = "/*__AREAL_RUN_DATA__*/"


def tool_metrics(episodes: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Tool-call figures of a batch from each episode's ``tool_calls`` and ``tool_errors``.

    An attempt is a call the environment ran (``tool_calls``, which include unknown tools and
    invalid arguments) or one it could not parse (``tool_errors["parse"]``). Rates are per
    attempt; kinds that never occurred in the batch are left out.
    """
    episodes = list(episodes)
    calls = sum(int(e.get("tool_calls", 0)) for e in episodes)
    errors: dict[str, int] = {}
    for e in episodes:
        for kind, n in dict(e.get("tool_errors") or {}).items():
            errors[kind] = errors.get(kind, 0) + int(n)
    attempts = calls + errors.get("parse", 0)
    out = {"tools/calls_per_episode": calls / max(len(episodes), 1)}
    out["tools/error_rate"] = sum(errors.values()) / attempts if attempts else 0.0
    for kind in sorted(errors):
        if errors[kind]:
            out[f"tools/error_rate/{kind}"] = errors[kind] / attempts
    return out


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree} if prefix else {}


def _scalars(row: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics line without its lists (batch ids): the charts plot numbers only."""
    return {k: v for k, v in row.items() if isinstance(v, int | float | str | bool) or v is None}


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities (which JSON lacks) as None: a gap in a curve."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _script_safe(data: Any) -> str:
    # inside <script>, "</" could close the element early and "<!--" open a comment
    text = json.dumps(_finite(data), ensure_ascii=False, default=str, allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def render_report(
    run_dir: str | os.PathLike[str],
    *,
    max_transcripts: int = 1000,
    refresh_s: float = 30.0,
) -> str:
    """The report page of ``run_dir`` as HTML (see the module docstring).

    ``max_transcripts``: the latest transcripts shown (the page says how many there are).
    """
    from areal_agents.eval_viewer import render_viewer

    run = Path(run_dir)
    rows = [_scalars(r) for r in read_jsonl(run / "metrics.jsonl", torn_ok=True)]
    transcripts = read_jsonl(run / "transcripts.jsonl", torn_ok=True)
    config_path = run / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    summary_path = run / "summary.json"
    summary: dict[str, Any] = {}
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError:  # being written by an older writer: next refresh has it
            summary = {}
    finished = bool(summary.get("finished")) and summary.get("steps") == len(rows)
    data = {
        "name": run.resolve().name,
        "metrics": rows,
        "config": _flatten(config or {}),
        "summary": {k: v for k, v in summary.items() if k != "run_dir"} if finished else {},
        "finished": finished,
        "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "refresh_s": refresh_s,
        "transcripts": len(transcripts),
        "transcripts_shown": min(len(transcripts), max_transcripts),
    }
    shown = transcripts[-max_transcripts:]
    env = (config.get("env") or {}).get("name") if isinstance(config, Mapping) else None
    model = (config.get("model") or {}).get("name") if isinstance(config, Mapping) else None
    viewer_summary = {
        "title": f"Run report: {data['name']}",
        "env": env or summary.get("env", "?"),
        "model": model or summary.get("model", "?"),
        "pass_threshold": 1.0,
        "episodes": len(transcripts),
        "episodes_shown": len(shown),
    }
    template = REPORT_TEMPLATE.read_text()
    head, _, body = template.partition("<!--BODY-->")
    head = head.partition("<!--HEAD-->")[2]
    body = body.replace(_SLOT, _script_safe(data))
    return render_viewer(shown, viewer_summary, head=head, body=body)


def write_report(
    run_dir: str | os.PathLike[str],
    *,
    max_transcripts: int = 1000,
    refresh_s: float = 30.0,
) -> Path:
    """Write ``run_dir/report.html`` atomically (temporary file, then rename); return its path."""
    run = Path(run_dir)
    if not run.is_dir():  # a report never creates the run it describes
        raise FileNotFoundError(f"no run directory at {run}")
    page = render_report(run, max_transcripts=max_transcripts, refresh_s=refresh_s)
    target = run / "report.html"
    atomic_write(target, page)
    return target


def refresh_report(run_dir: str | os.PathLike[str]) -> Path | None:
    """:func:`write_report` for the training loop: a failure is logged, never raised (the
    report must not stop a run)."""
    try:
        return write_report(run_dir)
    except Exception:
        logger.warning("could not write %s/report.html", run_dir, exc_info=True)
        return None
