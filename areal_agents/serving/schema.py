"""The OpenAI request bodies the built-in server accepts, their checks, and Hermes tool calls.

Field names and limits follow vLLM's OpenAI server (including its RL extensions
``return_token_ids`` and ``ignore_eos``); unknown fields are ignored, as vLLM does.

>>> content, calls = parse_hermes_tool_calls(
...     'Sure. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
>>> content, calls[0]["function"]
('Sure.', {'name': 'f', 'arguments': '{"x": 1}'})
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "APIError",
    "ChatRequest",
    "CompletionRequest",
    "SamplingRequest",
    "check_messages",
    "check_tools",
    "parse_hermes_tool_calls",
]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TOOL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class APIError(Exception):
    """An error answered in the OpenAI error format."""

    def __init__(
        self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class SamplingRequest(BaseModel):
    """The fields chat and completion requests share (sampling, stopping, streaming)."""

    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as vLLM does

    model: str
    n: int = Field(1, ge=1, le=64)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # vLLM's range (int64)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False


class ChatRequest(SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions`` (text or token-id prompts)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


def parse_hermes_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split ``text`` into content and OpenAI ``tool_calls`` (``<tool_call>`` JSON blocks).

    As vLLM's hermes parser: when any block is not a JSON object with a ``name``, nothing is
    parsed and the whole text is content.
    """
    blocks = _TOOL_BLOCK.findall(text)
    if not blocks:
        return text, []
    calls = []
    for raw in blocks:
        try:
            data = json.loads(raw.strip())
        except json.JSONDecodeError:
            return text, []
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return text, []
        arguments = data.get("arguments", {})
        calls.append(
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": data["name"],
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    content = text[: text.find("<tool_call>")].strip()
    return content or None, calls


def check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's tools, each checked (name, JSON schema); raises :class:`APIError`."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    out = []
    for i, tool in enumerate(tools or []):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, dict):
            raise APIError(400, f"tools[{i}]: expected {{'type': 'function', 'function': {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise APIError(
                400, f"tools[{i}].function.name {name!r} must match [A-Za-z0-9_-]{{1,64}}"
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise APIError(400, f"tools[{i}].function.parameters must be a JSON schema object")
        try:
            Draft202012Validator.check_schema(params)
        except SchemaError as e:
            raise APIError(
                400, f"tools[{i}].function.parameters: bad schema: {e.message}"
            ) from None
        out.append(tool)
    return out


def check_messages(messages: list[dict[str, Any]]) -> None:
    """Check roles and normalise content (text parts joined, None as ""); raises
    :class:`APIError` (a part that is not ``{"type": "text", "text": str}`` included)."""
    for i, m in enumerate(messages):
        if m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            raise APIError(400, f"messages[{i}].role {m.get('role')!r:.80} is not a chat role")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type", "text") != "text":
                    raise APIError(
                        400, f"messages[{i}].content[{j}] must be a text part", param="messages"
                    )
                text = part.get("text", "")
                if not isinstance(text, str):
                    raise APIError(
                        400, f"messages[{i}].content[{j}].text must be a string", param="messages"
                    )
                texts.append(text)
            m["content"] = "".join(texts)
        elif content is None:
            m["content"] = ""
        elif not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string or content parts")
        if m["role"] == "developer":
            m["role"] = "system"
