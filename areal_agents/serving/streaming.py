"""Streaming for the built-in server: ``stream=true`` as server-sent events, OpenAI's format.

Tokens come from the engine as they are sampled (:attr:`GenerationRequest.on_token`), are
decoded incrementally (text is held back while it may still be an incomplete character or the
start of a stop string), and leave as ``data: {json}`` events, ending with ``data: [DONE]``.

A chat stream sends, per choice, a first delta with the role, then content deltas, then one
empty delta with the ``finish_reason``. When tools are on, text from ``<tool_call>`` on is held
back and parsed when the choice ends, as the non-streaming response parses it
(:func:`~areal_agents.serving.schema.parse_hermes_tool_calls`): each call leaves as two
``delta.tool_calls`` entries with its ``index`` (one with ``id``, ``type`` and the function
name, one with the arguments), or, when the blocks do not parse, the held text leaves as
content. With ``stream_options.include_usage`` a last chunk carries ``usage`` and no choices.
Completions stream ``text`` deltas the same way. Log-probabilities and token ids are not
streamed (such requests are refused).

>>> splitter = ToolCallSplitter(tools=True)
>>> [splitter.feed(piece) for piece in ("Let me ", "check. <to", "ol_call>{", '"name": "f"}')]
['Let me', ' check.', '', '']
>>> splitter.feed("</tool_call>")
''
>>> rest, calls = splitter.finish()
>>> rest, [c["function"]["name"] for c in calls]
('', ['f'])
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from typing import Any

from areal_agents.files import json_text
from areal_agents.serving.engine import Engine, GenerationRequest, GenerationResult
from areal_agents.serving.schema import parse_hermes_tool_calls

__all__ = [
    "Detokenizer",
    "TokenStream",
    "ToolCallSplitter",
    "chat_events",
    "completion_events",
]

_TAG = "<tool_call>"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class Detokenizer:
    """Text of a growing token sequence, released only once it cannot change any more.

    Args:
        tokenizer: a Hugging Face tokenizer.
        stop: the request's stop strings; as many characters as the longest one are held back
            until the end, since the final text is cut before a stop string.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0
        self.hold = max((len(s) for s in stop), default=0)

    def push(self, token: int) -> str:
        """Add one token; returns the text that became safe to send."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # part of a multi-byte character
            return ""
        safe = len(text) - self.hold
        if safe <= self.sent:
            return ""
        out, self.sent = text[self.sent : safe], safe
        return out

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the whole answer, cut at a stop string) not yet sent."""
        return final_text[self.sent :]


class ToolCallSplitter:
    """Splits streamed text into content to send now and Hermes tool calls parsed at the end.

    With ``tools`` off, all text is content. With tools on, content stops where ``<tool_call>``
    begins; trailing whitespace and a possible start of the tag are held back until the next
    piece shows what they are.
    """

    def __init__(self, tools: bool) -> None:
        self.tools = tools
        self.text = ""
        self.sent = 0
        self.in_call = False

    def feed(self, piece: str) -> str:
        """Add text; returns the content that can be sent now."""
        self.text += piece
        if not self.tools:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        if self.in_call:
            return ""
        cut = self.text.find(_TAG)
        if cut >= 0:
            self.in_call = True
            end = cut
        else:
            end = len(self.text) - _partial_suffix(self.text, _TAG)
        end = len(self.text[:end].rstrip())
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : end], end
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """Content still to send, and the tool calls (OpenAI ``tool_calls`` entries)."""
        if self.tools:
            _, calls = parse_hermes_tool_calls(self.text)
            if calls:
                return "", calls
        return self.text[self.sent :], []


class TokenStream:
    """The tokens of ``requests`` as the engine samples them, delivered on the event loop.

    Submitting happens in the constructor, so a request the engine refuses raises before any
    byte of the response is sent. Iterating yields ``(index, token)`` for each token and
    ``(index, result)`` when request ``index`` ends, in the engine's order. When iteration
    stops early (the client went away and the response task was cancelled), the requests
    still running are cancelled, so they leave the engine's batch at its next step.
    """

    def __init__(self, engine: Engine, requests: Sequence[GenerationRequest]) -> None:
        loop = asyncio.get_running_loop()
        self._requests = list(requests)
        self._queue: asyncio.Queue[tuple[int, int | Future[GenerationResult]]] = asyncio.Queue()
        self._left = len(requests)

        def put(item: tuple[int, int | Future[GenerationResult]]) -> None:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)

        def report_tokens(index: int) -> Callable[[int], None]:
            return lambda token: put((index, token))

        def report_end(index: int) -> Callable[[Future[GenerationResult]], None]:
            return lambda future: put((index, future))

        for i, request in enumerate(requests):
            request.on_token = report_tokens(i)
        for i, request in enumerate(requests):
            engine.submit(request).add_done_callback(report_end(i))

    async def __aiter__(self) -> AsyncIterator[tuple[int, int | GenerationResult]]:
        try:
            while self._left:
                index, item = await self._queue.get()
                if isinstance(item, int):
                    yield index, item
                else:
                    self._left -= 1
                    yield index, item.result()  # an engine failure raises here
        finally:
            if self._left:
                self.cancel()

    def cancel(self) -> None:
        """Stop every request of this stream at the engine's next step."""
        for request in self._requests:
            request.cancelled = True


def _sse(data: dict[str, Any] | str) -> str:
    body = data if isinstance(data, str) else json_text(data)  # any text, escaped
    return f"data: {body}\n\n"


def _usage(prompt_tokens: int, results: Sequence[GenerationResult]) -> dict[str, int]:
    completion = sum(len(r.token_ids) for r in results)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


async def _guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events``, then ``[DONE]``; an error mid-stream becomes an error event first."""
    try:
        async for event in events:
            yield event
    except Exception as e:  # the headers are sent: the error can only travel in the stream
        yield _sse({"error": {"message": str(e), "type": type(e).__name__, "code": 500}})
    yield _sse("[DONE]")


def chat_events(
    stream: TokenStream,
    *,
    model: str,
    detokenizers: Sequence[Detokenizer],
    tools: bool,
    final_text: Callable[[GenerationResult], str],
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The server-sent events of a streamed chat completion (``chat.completion.chunk``)."""
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse({**head, "choices": [{**choice, **extra}]})

    async def events() -> AsyncIterator[str]:
        splitters = [ToolCallSplitter(tools) for _ in detokenizers]
        results: list[GenerationResult] = []
        for i in range(len(detokenizers)):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for i, item in stream:
            if isinstance(item, int):
                if text := splitters[i].feed(detokenizers[i].push(item)):
                    yield chunk(i, {"content": text})
                continue
            results.append(item)
            splitters[i].feed(detokenizers[i].finish(final_text(item)))
            rest, calls = splitters[i].finish()
            if rest:
                yield chunk(i, {"content": rest})
            for k, call in enumerate(calls):
                name = {"name": call["function"]["name"], "arguments": ""}
                first = {"index": k, "id": call["id"], "type": "function", "function": name}
                yield chunk(i, {"tool_calls": [first]})
                arguments = {"arguments": call["function"]["arguments"]}
                yield chunk(i, {"tool_calls": [{"index": k, "function": arguments}]})
            finish = "tool_calls" if calls and item.finish_reason == "stop" else item.finish_reason
            yield chunk(i, {}, finish, stop_reason=item.stop_reason)
        if include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(prompt_tokens, results)})

    return _guarded(events())


def completion_events(
    stream: TokenStream,
    *,
    model: str,
    detokenizers: Sequence[Detokenizer],
    final_text: Callable[[GenerationResult], str],
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The server-sent events of a streamed text completion (``text_completion`` chunks)."""
    head = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(index: int, text: str, finish: str | None = None, **extra: Any) -> str:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        return _sse({**head, "choices": [{**choice, **extra}]})

    async def events() -> AsyncIterator[str]:
        results: list[GenerationResult] = []
        async for i, item in stream:
            if isinstance(item, int):
                if text := detokenizers[i].push(item):
                    yield chunk(i, text)
                continue
            results.append(item)
            if rest := detokenizers[i].finish(final_text(item)):
                yield chunk(i, rest)
            yield chunk(i, "", item.finish_reason, stop_reason=item.stop_reason)
        if include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(prompt_tokens, results)})

    return _guarded(events())
