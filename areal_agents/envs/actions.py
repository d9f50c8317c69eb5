"""What an environment accepts as an action, and how any other value becomes a model mistake.

An action is model output relayed by a client, so :meth:`MultiTurnEnv.step` takes *any* value
and never raises on it. :func:`coerce_action` turns the value into a :class:`Turn` plus the
problems found in it:

* a ``str`` — the assistant's text (tool calls are parsed from it later);
* a :class:`Turn` — as a policy client returns it; ``tool_calls`` set means the endpoint
  parsed them. A structured call the endpoint returned malformed arrives as
  ``ToolCall(name="", arguments=<raw text>)`` and is a ``parse`` problem, not a call;
* an OpenAI assistant message ``dict`` (``content``, ``tool_calls``);
* anything else (``None``, bytes, numbers, lists), text with lone surrogates (not valid
  Unicode), or a message of the wrong shape: a problem, and the turn is taken as empty text.

A turn with problems is never a final answer: the environment reports each problem in the
next observation and counts it in ``info["tool_errors"]["parse"]``.

>>> turn, problems = coerce_action({"content": "hi", "tool_calls": "abc"})
>>> turn.text, [p.reason for p in problems]
('hi', ['tool_calls must be a list of tool calls, got str'])
>>> coerce_action(b"bytes")[1][0].reason
'the action must be text (a str, a Turn or an assistant message dict), got bytes'
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from areal_agents.tools.parsing import ParseProblem
from areal_agents.types import ToolCall, Turn

__all__ = ["clean_text", "coerce_action"]


def clean_text(text: str) -> str:
    """``text`` with anything that cannot be encoded as UTF-8 (lone surrogates) replaced by '?'."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _bad_unicode(text: str) -> ParseProblem | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return ParseProblem(
            text[e.start : e.start + 20].encode("utf-8", "replace").decode("utf-8"),
            f"the reply is not valid Unicode text (a lone surrogate at position {e.start})",
        )
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return clean_text(text if len(text) <= 200 else text[:200] + "...")


def _structured_call(entry: Any, index: int) -> ToolCall | ParseProblem:
    """One structured tool call (a ToolCall or an OpenAI ``tool_calls`` entry), checked."""
    name: Any
    arguments: Any
    call_id: Any
    if isinstance(entry, ToolCall):
        name, arguments, call_id = entry.name, entry.arguments, entry.id
    elif isinstance(entry, Mapping):
        function = entry.get("function")
        if not isinstance(function, Mapping):
            return ParseProblem(
                _short(entry),
                f"tool call {index} has no 'function' object (got {_short(function)})",
            )
        name, arguments, call_id = function.get("name"), function.get("arguments"), entry.get("id")
        if arguments is None:
            arguments = "{}"
    else:
        return ParseProblem(_short(entry), f"tool call {index} is not a tool call object")
    raw = arguments if isinstance(arguments, str) else _short(arguments)
    if not isinstance(name, str) or not name:
        return ParseProblem(clean_text(raw), f"tool call {index} has no function name")
    if not isinstance(call_id, str):
        call_id = ""
    if not isinstance(arguments, str):  # a dict (or a number: then the arguments check says so)
        try:
            arguments = json.dumps(arguments)
        except (TypeError, ValueError, RecursionError):
            return ParseProblem(raw, f"tool call {index}: its arguments are not JSON")
    for text in (name, arguments, call_id):
        if (problem := _bad_unicode(text)) is not None:
            return ParseProblem(problem.raw, f"tool call {index}: {problem.reason}")
    if isinstance(entry, ToolCall) and (name, arguments, call_id) == (
        entry.name,
        entry.arguments,
        entry.id,
    ):
        return entry
    return ToolCall(name, arguments, call_id)


def _structured_calls(value: Any) -> tuple[tuple[ToolCall, ...] | None, list[ParseProblem]]:
    if value is None:
        return None, []
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        return None, [
            ParseProblem(
                _short(value),
                f"tool_calls must be a list of tool calls, got {type(value).__name__}",
            )
        ]
    calls: list[ToolCall] = []
    problems: list[ParseProblem] = []
    for i, entry in enumerate(value):
        checked = _structured_call(entry, i)
        (calls if isinstance(checked, ToolCall) else problems).append(checked)  # type: ignore[arg-type]
    return tuple(calls), problems


def _message_text(content: Any) -> tuple[str, list[ParseProblem]]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if isinstance(content, list):  # content parts: keep the text ones
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts), []  # type: ignore[arg-type]
    return "", [
        ParseProblem(_short(content), f"content must be text, got {type(content).__name__}")
    ]


def coerce_action(action: Any) -> tuple[Turn, list[ParseProblem]]:
    """The :class:`Turn` an action stands for, and what is wrong with it (see the module doc)."""
    problems: list[ParseProblem] = []
    if isinstance(action, Turn):
        turn = action
        if not isinstance(turn.text, str):
            problems.append(
                ParseProblem(
                    _short(turn.text), f"Turn.text must be a str, got {type(turn.text).__name__}"
                )
            )
            turn = dataclasses.replace(turn, text="")
        calls, call_problems = _structured_calls(turn.tool_calls)
        problems += call_problems
        if calls != turn.tool_calls:
            turn = dataclasses.replace(turn, tool_calls=calls)
    elif isinstance(action, str):
        turn = Turn(text=action)
    elif isinstance(action, Mapping):
        role = action.get("role", "assistant")
        if role != "assistant":
            problems.append(
                ParseProblem(
                    _short(role),
                    f"an action message must have role 'assistant', got {_short(role)}",
                )
            )
        text, text_problems = _message_text(action.get("content"))
        calls, call_problems = _structured_calls(action.get("tool_calls"))
        problems += text_problems + call_problems
        if not call_problems and not calls:
            calls = None  # an empty list: no structured calls, parse the text (as the API does)
        turn = Turn(text=text, tool_calls=calls)
    else:
        problems.append(
            ParseProblem(
                _short(action),
                "the action must be text (a str, a Turn or an assistant message dict), "
                f"got {type(action).__name__}",
            )
        )
        turn = Turn(text="")
    if (problem := _bad_unicode(turn.text)) is not None:
        problems.append(problem)
        turn = dataclasses.replace(turn, text=clean_text(turn.text))
    return turn, problems
