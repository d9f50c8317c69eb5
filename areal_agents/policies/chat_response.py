"""A total parser of ``/v1/chat/completions`` reply bodies: any bytes in, a reply or a typed error.

Endpoints under evaluation are not trusted to speak the protocol. The body is parsed here, not
by the OpenAI SDK (whose response models accept anything and fail later, far from the cause),
and every input ends in exactly one of two ways:

* a :class:`ChatReply`, whose ``text`` is a string without lone surrogates, whose
  ``tool_calls`` are :class:`~areal_agents.types.ToolCall` objects with string fields, and
  whose ``usage`` is ``None`` or two non-negative integers;
* :class:`~areal_agents.errors.MalformedResponseError` (an infrastructure fault: the caller
  retries, then drops the episode and counts it).

The line between the two follows who wrote the field. What the *server* writes must be
well-formed, or the reply is malformed: the body (UTF-8 JSON, an object, no nesting beyond the
parser's recursion limit), ``choices`` (a non-empty list), ``message`` (an object),
``content`` (a string or null), ``finish_reason``, ``usage``, a tool call's ``id`` and its
``arguments`` (a JSON *string*; an object there is a serialisation bug of the server), and no
lone surrogate in any of those strings. What the *model* chose — which tool to call, and the
shape of its tool calls — is the model's mistake when it is wrong: an entry of ``tool_calls``
that is not an object, has no ``function`` object, or whose ``function.name`` is null, empty or
not a string, and a ``tool_calls`` that is not a list (a string, an object), each become
``ToolCall(name="", arguments=<the entry's raw text>)``. Environments count an empty-name call
as a ``parse`` error and answer it with an error observation, so a malformed call is neither
an answer nor a silent 0; ``ChatReply.malformed_tool_calls`` counts them.

>>> reply = parse_chat_completion(b'{"choices": [{"message": {"content": "hi"}}]}')
>>> reply.text, reply.tool_calls, reply.usage
('hi', None, None)
>>> parse_chat_completion(b'{"choices": [{"message": {"tool_calls": "f(1)"}}]}').tool_calls
(ToolCall(name='', arguments='f(1)', id=''),)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from areal_agents.errors import MalformedResponseError
from areal_agents.types import ToolCall

__all__ = ["ChatReply", "parse_chat_completion"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_SHOWN = 160  # characters of a bad body quoted in an error message


@dataclass(frozen=True)
class ChatReply:
    """The parts of a chat completion that a policy turn needs, all well-formed."""

    text: str
    """The assistant's content ("" when it was null)."""
    tool_calls: tuple[ToolCall, ...] | None
    """Structured tool calls; None when the endpoint returned none (the environment then
    parses the text). Malformed entries are ``ToolCall(name="", arguments=<raw entry>)``."""
    finish_reason: str | None
    usage: dict[str, int] | None
    """``prompt_tokens`` and ``completion_tokens``, when the endpoint reported usage."""
    malformed_tool_calls: int = 0
    """How many of ``tool_calls`` were malformed (empty name)."""
    reasoning: str | None = None
    """``message.reasoning_content`` (or ``message.reasoning``), when the endpoint sent it."""


def parse_chat_completion(body: bytes | str) -> ChatReply:
    """Parse one chat completion body; raises :class:`MalformedResponseError` on anything else.

    Never raises another exception, whatever ``body`` holds (random bytes, huge or deeply
    nested JSON, invalid UTF-8, lone surrogates).
    """
    data = _load(body)
    if not isinstance(data, dict):
        raise MalformedResponseError(f"the reply is a JSON {_kind(data)}, not an object")
    choices = data.get("choices")
    if choices is None and isinstance(data.get("error"), Mapping | str):
        raise MalformedResponseError(f"the reply carries an error: {_show(data['error'])}")
    if not isinstance(choices, list) or not choices:
        what = "missing" if "choices" not in data else f"a {_kind(choices)}"
        if isinstance(choices, list):
            what = "empty"
        raise MalformedResponseError(f"the reply has no choices (choices is {what})")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedResponseError(f"choices[0] is a {_kind(choice)}, not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedResponseError(f"choices[0].message is a {_kind(message)}, not an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise MalformedResponseError(
            f"choices[0].message.content is a {_kind(content)}, not a string or null"
        )
    text = _clean(content or "", "choices[0].message.content")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise MalformedResponseError(f"choices[0].finish_reason is a {_kind(finish)}")
    calls = _tool_calls(message.get("tool_calls"))
    malformed = sum(not c.name for c in calls or ())
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    if reasoning is not None and not isinstance(reasoning, str):
        raise MalformedResponseError(
            f"choices[0].message.reasoning_content is a {_kind(reasoning)}, not a string or null"
        )
    return ChatReply(
        text=text,
        tool_calls=calls,
        finish_reason=None if finish is None else _clean(finish, "finish_reason"),
        usage=_usage(data.get("usage")),
        malformed_tool_calls=malformed,
        reasoning=None if reasoning is None else _clean(reasoning, "message.reasoning_content"),
    )


def _load(body: bytes | str) -> Any:
    if isinstance(body, bytes | bytearray):
        try:
            body = bytes(body).decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise MalformedResponseError(f"the reply is not UTF-8 text ({e.reason})") from None
    if not body.strip():
        raise MalformedResponseError("the reply body is empty")
    try:
        return json.loads(body)
    except RecursionError:
        raise MalformedResponseError("the reply is JSON nested too deeply to parse") from None
    except ValueError as e:
        raise MalformedResponseError(f"the reply is not JSON ({e}): {_show(body)}") from None


def _tool_calls(raw: Any) -> tuple[ToolCall, ...] | None:
    if raw is None or (isinstance(raw, list) and not raw):
        return None
    if isinstance(raw, str):  # the model's call as text where a list belongs
        return (ToolCall(name="", arguments=_clean(raw, "message.tool_calls")),)
    if not isinstance(raw, list):
        return (ToolCall(name="", arguments=_dump(raw)),)
    return tuple(_tool_call(entry, i) for i, entry in enumerate(raw))


def _tool_call(entry: Any, index: int) -> ToolCall:
    where = f"tool_calls[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("function"), dict):
        return ToolCall(name="", arguments=_dump(entry))
    function = entry["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name.strip() or _SURROGATE.search(name):
        return ToolCall(name="", arguments=_dump(entry))
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        raise MalformedResponseError(
            f"{where}.function.arguments is a {_kind(arguments)}; the protocol sends a JSON string"
        )
    call_id = entry.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise MalformedResponseError(f"{where}.id is a {_kind(call_id)}, not a string")
    return ToolCall(
        name=name,
        arguments=_clean(arguments, f"{where}.function.arguments"),
        id=_clean(call_id or "", f"{where}.id"),
    )


def _usage(raw: Any) -> dict[str, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise MalformedResponseError(f"usage is a {_kind(raw)}, not an object")
    out: dict[str, int] = {}
    for key in ("prompt_tokens", "completion_tokens"):
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise MalformedResponseError(f"usage.{key} is {_show(value)}, not a count")
        out[key] = value
    return out


def _clean(text: str, where: str) -> str:
    """``text`` unless it holds a lone surrogate (not Unicode text: it cannot be encoded)."""
    if _SURROGATE.search(text):
        raise MalformedResponseError(f"{where} holds a lone UTF-16 surrogate (invalid text)")
    return text


def _dump(value: Any) -> str:
    """The raw text of a malformed entry, as JSON (ASCII: safe to store and to send back)."""
    try:
        return json.dumps(value, ensure_ascii=True)
    except (RecursionError, ValueError, TypeError):
        return repr(type(value))


def _kind(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else _dump(value)
    text = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return repr(text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"))
