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

Once the run has ended, the page opens with what ``summary.json`` measured
(:func:`held_out_view`): held-out success of the base model, after the warm start and after
RL, each with its 95% interval (the summary's own, else Wilson's from the episode count), the
paired changes between them with their intervals (``held_out.warm_start_gain``, ``rl_gain``,
``gain``), each evaluation's tool calls and turns per episode, and the start-up figures (time to
the first step, the start-up phases). The charts add the learner's policy movement
(``policy/update_kl``, ``behavior/kl``, ``approx_kl``), the importance weights' quantiles and
the clipped and masked fractions, when the run logs them.

The trainer calls :func:`write_report` after every step and at the end; the file is replaced
atomically, so a browser or a watcher never reads half of it. Any text is safe: a lone
surrogate (from a model's output, a file name) is written escaped, never fatal.
:func:`tool_metrics` gives the tool-call counts the error-rate chart plots.

>>> tool_metrics([{"tool_calls": 3, "tool_errors": {"parse": 1, "unknown_tool": 1}}])
{'tools/calls_per_episode': 3.0, 'tools/error_rate': 0.5, 'tools/error_rate/parse': 0.25, \
'tools/error_rate/unknown_tool': 0.25}
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from areal_agents.files import atomic_write, read_jsonl
from areal_agents.stats import wilson_interval

__all__ = [
    "REPORT_TEMPLATE",
    "held_out_view",
    "refresh_report",
    "render_report",
    "tool_metrics",
    "write_report",
]

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


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (not valid Unicode: UTF-8 cannot hold it) as a
    ``\\udXXX`` escape: valid JSON inside a string, plain text elsewhere."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _script_safe(data: Any) -> str:
    # inside <script>, "</" could close the element early and "<!--" open a comment
    text = json.dumps(_finite(data), ensure_ascii=False, default=str, allow_nan=False)
    return _escape_surrogates(text.replace("</", "<\\/").replace("<!--", "<\\u0021--"))


#: The held-out measurements, in order, and what the page calls them.
_HELD_OUT = (
    ("base", "base model"),
    ("before", "after the warm start"),
    ("after", "after RL"),
    ("last", "RL's last step (validation chose another)"),
)
#: The paired changes ``summary.json`` holds (``trainers/held_out.py:paired_gains``).
_CHANGES = (
    ("warm_start_gain", "warm start"),
    ("rl_gain", "RL"),
    ("rl_gain_last", "RL's last step"),
    ("rl_gain_undemonstrated", "RL, on families never demonstrated"),
    ("rl_gain_demonstrated", "RL, on demonstrated families"),
    ("gain", "warm start + RL"),
)


def _interval(value: Any) -> list[float] | None:
    """An interval field as ``[low, high]`` in rates (a list or a ``{low, high}`` mapping; in
    points when a bound exceeds 1), or None."""
    if isinstance(value, Mapping):
        value = [value.get("low", value.get("lo")), value.get("high", value.get("hi"))]
    bounds = _points(value)
    if bounds is None:
        return None
    scale = 100.0 if max(map(abs, bounds)) > 1 else 1.0
    return [bound / scale for bound in bounds]


def _points(value: Any) -> list[float] | None:
    """A ``[low, high]`` pair of finite numbers as floats (an interval in whatever unit it was
    written in: the paired changes' are in points), or None."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in value):
        return None
    return [float(value[0]), float(value[1])]


def _eval_summary(run: Path, when: str) -> dict[str, Any]:
    path = run / "eval" / when / "summary.json"
    try:
        loaded = json.loads(path.read_text(errors="replace")) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def held_out_view(summary: Mapping[str, Any], run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What the page shows of the held-out evaluations in ``summary.json`` (``held_out``).

    ``rows``: one per measurement taken (base, after the warm start, after RL; without a warm
    start the first is "before RL"), with ``success``, ``episodes``, a 95% ``ci`` (``[low,
    high]``: the summary's ``ci``/``ci95`` when it has one, ``source`` says which; else the
    Wilson interval of ``success x episodes`` solved tasks) and the evaluation's own
    ``tool_calls_per_episode`` and ``turns_per_episode`` (from ``<run>/eval/<when>/
    summary.json``). ``changes``: the paired comparisons the summary holds, with their
    intervals in points. ``tasks``: how many held-out tasks; 0 (or no ``held_out``): none.

    >>> view = held_out_view({"held_out": {"tasks": 64, "after": {"success": 0.75,
    ...     "episodes": 64}}}, "/nonexistent")
    >>> row = view["rows"][0]
    >>> row["label"], row["source"], [round(v, 3) for v in row["ci"]]
    ('after RL', 'Wilson', [0.632, 0.84])
    """
    held = summary.get("held_out")
    if not isinstance(held, Mapping):
        return {"tasks": 0, "rows": [], "changes": []}
    rows = []
    for when, label in _HELD_OUT:
        result = held.get(when)
        if not isinstance(result, Mapping) or not isinstance(result.get("success"), int | float):
            continue
        if when == "before" and not isinstance(held.get("base"), Mapping):
            label = "before RL"
        success, episodes = float(result["success"]), result.get("episodes")
        n = int(episodes) if isinstance(episodes, int | float) and episodes > 0 else 0
        given = next((_interval(result.get(k)) for k in ("ci95", "ci") if k in result), None)
        ci, source = given, "summary.json"
        if ci is None and n:
            ci, source = list(wilson_interval(round(success * n), n)), "Wilson"
        own = _eval_summary(Path(run_dir), when)
        rows.append(
            {
                "when": when,
                "label": label,
                "success": success,
                "episodes": n,
                "ci": ci,
                "source": source if ci else None,
                "tool_calls_per_episode": own.get("tool_calls_per_episode"),
                "turns_per_episode": own.get("turns_per_episode"),
            }
        )
    changes = []
    for key, label in _CHANGES:
        c = held.get(key)
        if isinstance(c, Mapping) and isinstance(c.get("gain_points"), int | float):
            changes.append(
                {
                    "key": key,
                    "label": label,
                    "gain_points": float(c["gain_points"]),
                    # in points already: a narrow one (+0.0 to +0.8) is not a rate to scale
                    "ci_points": _points(c.get("ci95_points")),
                    "family_ci_points": _points(c.get("family_ci95_points")),
                    **{
                        k: c.get(k) for k in ("n", "improved", "regressed", "mcnemar_p", "families")
                    },
                }
            )
    tasks = held.get("tasks")
    return {"tasks": tasks if isinstance(tasks, int) else 0, "rows": rows, "changes": changes}


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
    try:  # text that is not UTF-8 (a path, a prompt) is shown replaced, never fatal
        config = yaml.safe_load(config_path.read_text(errors="replace"))
    except (OSError, yaml.YAMLError):
        config = {}
    config = config if isinstance(config, Mapping) else {}
    summary_path = run / "summary.json"
    summary: dict[str, Any] = {}
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text(errors="replace"))
        except json.JSONDecodeError:  # being written by an older writer: next refresh has it
            summary = {}
    summary = summary if isinstance(summary, dict) else {}
    finished = bool(summary.get("finished")) and summary.get("steps") == len(rows)
    data: dict[str, Any] = {
        "name": run.resolve().name,
        "metrics": rows,
        "config": _flatten(config or {}),
        "summary": {k: v for k, v in summary.items() if k != "run_dir"} if finished else {},
        "finished": finished,
        "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "refresh_s": refresh_s,
        "transcripts": len(transcripts),
        "transcripts_shown": min(len(transcripts), max_transcripts),
        "held_out": held_out_view(summary, run) if finished else None,
        "startup": {
            "time_to_first_step_s": summary.get("time_to_first_step_s"),
            "without_eval_s": summary.get("time_to_first_step_without_eval_s"),
            "phases": summary.get("startup") if isinstance(summary.get("startup"), dict) else {},
        }
        if finished
        else None,
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
    return _escape_surrogates(render_viewer(shown, viewer_summary, head=head, body=body))


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
