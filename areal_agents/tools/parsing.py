"""Parse tool calls out of assistant text.

Models without an endpoint-side tool parser write their calls into the text. The Hermes/Qwen
format wraps a JSON object in ``<tool_call>...</tool_call>``; a call that cannot be parsed is
returned as a :class:`ParseProblem` so that the environment can tell the model what was wrong.

Model text is hostile input: parsing is linear in its length (no backtracking regular
expressions), and JSON that nests deeper than :data:`MAX_JSON_DEPTH` levels is a problem to
report, never a ``RecursionError``.

>>> calls, problems = parse_tool_calls(
...     'Let me check. <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
...     '<tool_call>{"name": oops}</tool_call>')
>>> [c.name for c in calls], [p.reason[:20] for p in problems]
(['python'], ['invalid JSON: Expect'])
>>> load_json("[" * 100_000)
Traceback (most recent call last):
...
ValueError: JSON nested deeper than 64 levels
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from areal_agents.types import ToolCall

__all__ = [
    "MAX_JSON_DEPTH",
    "ParseProblem",
    "load_json",
    "parse_tool_calls",
    "strip_tool_calls",
]

#: Nesting levels (objects and arrays) that model-written JSON may have.
MAX_JSON_DEPTH = 64
_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ParseProblem:
    """A tool call the model tried to make but that could not be parsed."""

    raw: str
    reason: str


def _too_deep(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def load_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for model-written text; every failure is a ``ValueError`` with a short reason.

    Nesting deeper than ``max_depth`` is refused (the standard parser would raise
    ``RecursionError`` near a thousand levels, and every later consumer of a deep value would
    too); so are integer literals past Python's digit limit.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at position {e.pos}") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise ValueError(f"invalid JSON: {e}") from None
    if _too_deep(value, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    return value


def _blocks(text: str) -> Iterator[tuple[int, int, str]]:
    """``(start, end, body)`` of each ``<tool_call>`` block; the last may be unterminated."""
    pos = 0
    while (start := text.find(_OPEN, pos)) >= 0:
        body_start = start + len(_OPEN)
        close = text.find(_CLOSE, body_start)
        if close < 0:
            yield start, len(text), text[body_start:]
            return
        yield start, close + len(_CLOSE), text[body_start:close]
        pos = close + len(_CLOSE)


def _unfence(body: str) -> str:
    """The body without a Markdown fence around it (```` ```json ... ``` ````)."""
    body = body.strip()
    if body.startswith("```"):
        body = body[3:]
        if body.startswith("json"):
            body = body[4:]
        body = body.lstrip()
    if body.endswith("```"):
        body = body[:-3].rstrip()
    return body


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    text = json.dumps(arguments, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \\ud800 escape: keep it escaped
        text = json.dumps(arguments)
    return text


def parse_tool_calls(
    text: str, *, id_prefix: str = "call"
) -> tuple[list[ToolCall], list[ParseProblem]]:
    """All Hermes-style ``<tool_call>`` blocks in ``text``: the good calls and the problems.

    An unterminated last block is still parsed (generation may stop on ``</tool_call>``).
    Call ids are ``{id_prefix}_{i}`` in order of appearance, so they are deterministic.
    Linear in ``len(text)``.
    """
    calls: list[ToolCall] = []
    problems: list[ParseProblem] = []
    for i, (_, _, raw) in enumerate(_blocks(text)):
        try:
            data = load_json(_unfence(raw))
        except ValueError as e:
            problems.append(ParseProblem(raw, str(e)))
            continue
        if not isinstance(data, dict):
            problems.append(ParseProblem(raw, "a tool call must be a JSON object"))
            continue
        name = data.get("name")
        if not isinstance(name, str) or not name:
            problems.append(ParseProblem(raw, 'missing "name" (a string)'))
            continue
        arguments = data.get("arguments", data.get("parameters", {}))
        calls.append(
            ToolCall(name=name, arguments=_arguments_text(arguments), id=f"{id_prefix}_{i}")
        )
    return calls, problems


def strip_tool_calls(text: str) -> str:
    """``text`` without its ``<tool_call>`` blocks (the prose the model wrote around them)."""
    parts = []
    pos = 0
    for start, end, _ in _blocks(text):
        parts.append(text[pos:start])
        pos = end
    parts.append(text[pos:])
    return "".join(parts).strip()
