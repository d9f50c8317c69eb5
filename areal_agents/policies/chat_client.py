r"""The chat client: a :class:`~areal_agents.policies.base.Policy` over any OpenAI-compatible
``/v1/chat/completions`` endpoint (vLLM, the built-in server, a hosted API).

It sends the conversation and the environment's tool schemas and returns the assistant turn
with the endpoint's structured tool calls. When the endpoint parsed none, ``tool_calls`` is left
``None`` so the environment parses ``<tool_call>`` blocks from the text itself (endpoints
without a tool parser return them as text).

The endpoint is not trusted: each reply body is read with a size limit inside the request's
deadline and parsed by :func:`~areal_agents.policies.chat_response.parse_chat_completion`, so
a malformed reply is a retried, then counted, :class:`~areal_agents.errors.EndpointError`, and
a malformed tool call reaches the environment as ``ToolCall(name="", arguments=<raw>)`` (a
counted ``parse`` error there). :attr:`ChatPolicy.stats` counts both.

Reasoning: the turn keeps what the endpoint returned as ``reasoning_content`` (so it reaches
the transcripts), and ``<think>`` spans stay in the text. ``keep_reasoning`` says whether
earlier turns' reasoning goes back into the context: when False (the default, as Qwen3's and
DeepSeek-R1's templates do), earlier assistant messages are sent without ``<think>`` spans;
when True, their reasoning is sent inline as a ``<think>`` block before the content (the
OpenAI request format has no field for it). The token client does not take this choice: it
extends the sampled token ids, which keep every ``<think>`` span exactly as sampled.

>>> m = Message("assistant", "<think>\n2+2 is 4\n</think>\n\nIt is 4.")
>>> wire_message(m, keep_reasoning=False)["content"]
'It is 4.'
>>> wire_message(Message("assistant", "It is 4.", reasoning_content="2+2"), True)["content"]
'<think>\n2+2\n</think>\n\nIt is 4.'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import openai

from areal_agents.policies.chat_response import ChatReply, parse_chat_completion
from areal_agents.policies.openai_client import ClientSettings, EndpointClient, read_body
from areal_agents.types import Message, ToolSpec, Turn

__all__ = ["ChatPolicy", "wire_message"]

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def wire_message(message: Message, keep_reasoning: bool) -> dict[str, Any]:
    """``message`` as the request sends it: an assistant's reasoning inline as a ``<think>``
    block (``keep_reasoning``) or left out, ``<think>`` spans of its content included."""
    out = message.to_openai()
    out.pop("reasoning_content", None)
    if message.role != "assistant":
        return out
    if not keep_reasoning:
        out["content"] = _THINK.sub("", message.content)
    elif message.reasoning_content and "<think>" not in message.content:
        out["content"] = f"<think>\n{message.reasoning_content}\n</think>\n\n{message.content}"
    return out


class ChatPolicy:
    """Take turns through ``/v1/chat/completions``.

    Args:
        base_url: the endpoint, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        api_key: None reads ``AREAL_API_KEY`` / ``OPENAI_API_KEY``.
        temperature, top_p, max_tokens: sampling settings (``max_tokens=None``: server default).
        tool_choice: sent when tools are given (``"auto"``; None leaves it to the server).
        extra_body: more request fields (e.g. ``{"top_k": 20}`` for vLLM).
        keep_reasoning: whether earlier turns' reasoning stays in the context (module doc).
        timeout, max_retries, backoff_s, max_concurrency, max_response_bytes: see
            :class:`~areal_agents.policies.openai_client.ClientSettings`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int | None = 512,
        tool_choice: str | None = "auto",
        extra_body: Mapping[str, Any] | None = None,
        keep_reasoning: bool = False,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_concurrency: int = 64,
        max_response_bytes: int = 32 << 20,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.tool_choice = tool_choice
        self.extra_body = dict(extra_body or {})
        self.keep_reasoning = keep_reasoning
        self.endpoint = EndpointClient(
            ClientSettings(
                base_url=base_url,
                api_key=api_key,
                timeout=timeout,
                max_retries=max_retries,
                backoff_s=backoff_s,
                max_concurrency=max_concurrency,
                max_response_bytes=max_response_bytes,
            )
        )
        self.malformed_tool_calls = 0

    def request(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The request body (without ``extra_body``) for this conversation."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [wire_message(m, self.keep_reasoning) for m in conversation],
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if tools:
            body["tools"] = [t.to_openai() for t in tools]
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        return body

    @property
    def stats(self) -> dict[str, int]:
        """Requests so far: ``attempts``, ``retries``, failures by kind (``timeout``,
        ``connection``, ``malformed``, ``http_<status>``) and ``malformed_tool_calls``."""
        return {**self.endpoint.stats, "malformed_tool_calls": self.malformed_tool_calls}

    async def aclose(self) -> None:
        """Close this event loop's connections to the endpoint (:meth:`EndpointClient.aclose`)."""
        await self.endpoint.aclose()

    async def act(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> Turn:
        body = self.request(conversation, tools)
        extra = self.extra_body or None

        async def attempt(client: openai.AsyncOpenAI) -> ChatReply:
            create = client.chat.completions.with_streaming_response.create
            async with create(**body, extra_body=extra) as response:
                raw = await read_body(response, self.endpoint.settings.max_response_bytes)
            return parse_chat_completion(raw)

        reply = await self.endpoint.call("chat completion", attempt)
        self.malformed_tool_calls += reply.malformed_tool_calls
        return Turn(
            text=reply.text,
            tool_calls=reply.tool_calls,
            finish_reason=reply.finish_reason,
            usage=reply.usage,
            reasoning=reply.reasoning,
        )
