"""The static transcript viewer that ``python -m areal_agents.eval`` writes as ``index.html``.

One self-contained HTML file (no network, no server): the transcripts and the summary are
embedded as JSON, and a small script renders each episode (conversation, tool calls and
results, reward) with filters by outcome, reward range and task id. Filters can be preset in
the URL fragment, e.g. ``index.html#outcome=pass`` or ``#min=0.5&task=calc``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
    data = json.dumps({"episodes": list(records), "summary": dict(summary)}, ensure_ascii=False)
    # Inside <script>, "</" could close the element early: escape it (JSON allows "<\/").
    data = data.replace("</", "<\\/").replace("<!--", "<\\u0021--")
    page = VIEWER_TEMPLATE.read_text().replace(_SLOT, data)
    return page.replace(_HEAD, head, 1).replace(_BODY, body, 1)


def write_viewer(
    path: str | Path, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> Path:
    """Write the viewer page to ``path``."""
    path = Path(path)
    path.write_text(render_viewer(records, summary))
    return path
