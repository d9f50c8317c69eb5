"""Streaming pieces of the built-in server that need no model: incremental text and tool calls.

The end-to-end checks (the real ``openai`` client against the built-in server and vLLM) are in
``tests/policies/test_clients.py``. The tokenizer here is a fake that is honest about what it
replaces: token ``i`` decodes to ``PIECES[i]``, and the pieces of a multi-byte character decode
to the replacement character until the character is complete, as byte-level BPE does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from areal_agents.serving.streaming import Detokenizer, ToolCallSplitter

PIECES = ["Hello", " wor", "ld", " STO", "P", "\xe2", "\x82", "\xac", " x"]


class ByteTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        raw = "".join(PIECES[i] for i in ids).encode("latin-1")
        return raw.decode("utf-8", errors="replace")


def stream(detok: Detokenizer, ids: list[int]) -> list[str]:
    return [detok.push(i) for i in ids]


def test_text_is_released_as_it_becomes_final() -> None:
    detok = Detokenizer(ByteTokenizer())
    assert stream(detok, [0, 1, 2]) == ["Hello", " wor", "ld"]
    # a euro sign in three byte tokens: nothing until it is whole
    assert stream(detok, [5, 6, 7]) == ["", "", "\u20ac"]
    assert detok.finish("Hello world\u20ac") == ""


def test_a_stop_string_is_never_sent() -> None:
    detok = Detokenizer(ByteTokenizer(), stop=[" STOP"])
    sent = "".join(stream(detok, [0, 1, 2, 3, 4]))
    final = "Hello world"  # what the server answers: cut before the stop string
    assert final.startswith(sent) and " STO" not in sent
    assert sent + detok.finish(final) == final


def test_tool_calls_are_parsed_when_the_choice_ends() -> None:
    splitter = ToolCallSplitter(tools=True)
    call = json.dumps({"name": "calculator", "arguments": {"expression": "2+2"}})
    text = f"I will compute.\n<tool_call>\n{call}\n</tool_call>"
    sent = "".join(splitter.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    assert sent == "I will compute."
    rest, calls = splitter.finish()
    assert rest == "" and len(calls) == 1
    assert calls[0]["function"] == {"name": "calculator", "arguments": '{"expression": "2+2"}'}
    assert calls[0]["id"].startswith("chatcmpl-tool-")


def test_a_block_that_does_not_parse_comes_back_as_content() -> None:
    splitter = ToolCallSplitter(tools=True)
    text = "Try <tool_call>{not json</tool_call> then"
    sent = "".join(splitter.feed(c) for c in text)
    rest, calls = splitter.finish()
    assert calls == [] and sent + rest == text  # as the non-streaming answer's content


def test_text_that_only_looks_like_a_tag_start_is_released() -> None:
    splitter = ToolCallSplitter(tools=True)
    assert splitter.feed("a <to") == "a"
    assert splitter.feed("y> b") == " <toy> b"
    off = ToolCallSplitter(tools=False)  # tool_choice none: the tag is just text
    assert off.feed("<tool_call>{}") == "<tool_call>{}" and off.finish() == ("", [])


# ---- a stream whose client goes away stops generating (the tiny model, in this process) ------


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from areal_agents.serving.engine import Engine
    from areal_agents.trainers.modeling import tiny_model_path

    eng = Engine(tiny_model_path(), max_batch_size=4)
    yield eng
    eng.close()


def _long_request(**kw: Any) -> Any:
    from areal_agents.serving.engine import GenerationRequest

    return GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=200, ignore_eos=True, **kw)


def test_a_cancelled_request_leaves_the_batch_at_the_next_step(engine: Any) -> None:
    request = _long_request(temperature=0.0)
    seen: list[int] = []

    def on_token(token: int) -> None:
        seen.append(token)
        if len(seen) == 3:
            request.cancelled = True

    request.on_token = on_token
    result = engine.submit(request).result(timeout=120)
    assert result.finish_reason == "abort" and len(result.token_ids) == 3 == len(seen)


def test_a_stream_closed_early_cancels_its_requests(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from areal_agents.serving.streaming import TokenStream

    requests = [_long_request(temperature=1.0, seed=s) for s in (1, 2)]
    futures: list[Any] = []
    submit = engine.submit
    monkeypatch.setattr(engine, "submit", lambda r: futures.append(submit(r)) or futures[-1])

    async def read_two_then_leave() -> list[Any]:
        items = []
        stream = TokenStream(engine, requests).__aiter__()
        items.append(await anext(stream))
        items.append(await anext(stream))
        await stream.aclose()  # what a cancelled response task does to it
        return items

    items = asyncio.run(read_two_then_leave())
    assert all(isinstance(token, int) for _, token in items)
    assert all(r.cancelled for r in requests)
    results = [f.result(timeout=120) for f in futures]
    assert [r.finish_reason for r in results] == ["abort", "abort"]
    assert all(len(r.token_ids) < 200 for r in results)  # not run to max_tokens
