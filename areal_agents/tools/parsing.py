"""Parse tool calls out of assistant text.

Models without an endpoint-side tool parser write their calls into the text. The Hermes/Qwen
format wraps a JSON object in ``<tool_call>...</tool_call>``; a call that cannot be parsed is
returned as a :class:`ParseProblem` so that the environment can tell the model what was wrong.

>>> calls, problems = parse_tool_calls(
...     'Let me check. <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
...     '<tool_call>{"name": oops}</tool_call>')
>>> [c.name for c in calls], [p.reason[:20] for p in problems]
(['python'], ['invalid JSON: Expect'])
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from areal_agents.types import ToolCall

__all__ = ["ParseProblem", "parse_tool_calls", "strip_tool_calls"]

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$")


@dataclass(frozen=True)
class ParseProblem:
    """A tool call the model tried to make but that could not be parsed."""

    raw: str
    reason: str


def parse_tool_calls(
    text: str, *, id_prefix: str = "call"
) -> tuple[list[ToolCall], list[ParseProblem]]:
    """All Hermes-style ``<tool_call>`` blocks in ``text``: the good calls and the problems.

    An unterminated last block is still parsed (generation may stop on ``</tool_call>``).
    Call ids are ``{id_prefix}_{i}`` in order of appearance, so they are deterministic.
    """
    calls: list[ToolCall] = []
    problems: list[ParseProblem] = []
    for i, match in enumerate(_BLOCK.finditer(text)):
        raw = match.group(1)
        body = _FENCE.sub("", raw.strip())
        try:
            data = json.loads(body)
        except json.JSONDecodeError as e:
            problems.append(ParseProblem(raw, f"invalid JSON: {e.msg} at position {e.pos}"))
            continue
        if not isinstance(data, dict):
            problems.append(ParseProblem(raw, "a tool call must be a JSON object"))
            continue
        name = data.get("name")
        if not isinstance(name, str) or not name:
            problems.append(ParseProblem(raw, 'missing "name" (a string)'))
            continue
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):
            text_args = arguments
        else:
            text_args = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(name=name, arguments=text_args, id=f"{id_prefix}_{i}"))
    return calls, problems


def strip_tool_calls(text: str) -> str:
    """``text`` without its ``<tool_call>`` blocks (the prose the model wrote around them)."""
    return _BLOCK.sub("", text).strip()
