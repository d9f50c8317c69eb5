"""The static transcript viewer that ``python -m areal_agents.eval`` writes as ``index.html``.

One self-contained HTML file (no network, no server): the transcripts and the summary are
embedded as JSON, and a small script renders each episode (conversation, tool calls and
results, reward) with filters by outcome, reward range and task id. Filters can be preset in
the URL fragment, e.g. ``index.html#outcome=pass`` or ``#min=0.5&task=calc``.

Transcripts hold whatever a model, a tool or a test printed: any text is embedded escaped (a
lone surrogate as a JSON ``\\uXXXX`` escape, ``</script>`` as ``<\\/script>``, a NaN reward as
``"nan"``), so writing the page never fails on it and nothing in it can end the script early.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_agents.files import json_text

__all__ = ["VIEWER_TEMPLATE", "render_viewer", "write_viewer"]

#: The HTML page; ``/*__AREAL_EVAL_DATA__*/`` is replaced by the data.
VIEWER_TEMPLATE = Path(__file__).with_name("eval_viewer.html")
_SLOT = "/*__AREAL_EVAL_DATA__*/"
_HEAD = "<!--__AREAL_REPORT_HEAD__-->"
_BODY = "<!--__AREAL_REPORT_BODY__-->"


def render_viewer(
    records: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    *,
    head: str = "",
    body: str = "",
) -> str:
    """The viewer page with ``records`` (transcript lines) and ``summary`` embedded.

    ``head`` and ``body`` are HTML put at the end of ``<head>`` and right after the page header
    (the run report adds its charts there). A ``summary["title"]`` replaces the page title;
    records with a ``step`` can be filtered by step, and records with a grading status
    (``info.reward_details.status`` or ``info.outcome``) by status.

    >>> page = render_viewer([], {"env": "x", "model": "m", "pass_threshold": 1.0})
    >>> "</script><script>" in page, '"episodes": []' in page
    (False, True)
    """
    embedded = _finite({"episodes": list(records), "summary": dict(summary)})
    data = json_text(embedded, default=repr, allow_nan=False)
    # Inside <script>, "</" could close the element early: escape it (JSON allows "<\/").
    data = data.replace("</", "<\\/").replace("<!--", "<\\u0021--")
    page = VIEWER_TEMPLATE.read_text(encoding="utf-8").replace(_SLOT, data)
    return page.replace(_HEAD, head, 1).replace(_BODY, body, 1)


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"``: the
    page reads its data with ``JSON.parse``, which knows no ``NaN``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_viewer(
    path: str | Path, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> Path:
    """Write the viewer page to ``path`` (UTF-8, whatever the text in ``records``)."""
    path = Path(path)
    path.write_text(render_viewer(records, summary), encoding="utf-8", errors="backslashreplace")
    return path
