"""The chat completion parser is total: any body gives a well-formed reply or a typed error.

Property-based (hypothesis): random bytes, random JSON anywhere in a reply's envelope, huge
and deeply nested values, non-UTF-8 and lone surrogates. The examples pin the contract shared
with the environments: a malformed *tool call* becomes ``ToolCall(name="", arguments=<raw>)``;
a malformed *reply* is an error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_agents.errors import EndpointError, MalformedResponseError
from areal_agents.policies.chat_response import ChatReply, parse_chat_completion
from areal_agents.types import ToolCall

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)


def _well_formed(reply: ChatReply) -> None:
    """What every caller may rely on."""
    assert isinstance(reply.text, str)
    reply.text.encode("utf-8")  # no lone surrogate
    if reply.finish_reason is not None:
        assert isinstance(reply.finish_reason, str)
    if reply.usage is not None:
        assert set(reply.usage) == {"prompt_tokens", "completion_tokens"}
        assert all(type(v) is int and v >= 0 for v in reply.usage.values())
    if reply.tool_calls is not None:
        assert reply.tool_calls  # None, never an empty tuple
        for call in reply.tool_calls:
            assert isinstance(call, ToolCall)
            assert isinstance(call.name, str) and isinstance(call.arguments, str)
            assert isinstance(call.id, str)
            (call.name + call.arguments + call.id).encode("utf-8")
        malformed = sum(not c.name for c in reply.tool_calls)
        assert reply.malformed_tool_calls == malformed
    else:
        assert reply.malformed_tool_calls == 0


def _parse(body: bytes | str) -> None:
    try:
        reply = parse_chat_completion(body)
    except MalformedResponseError as e:
        assert isinstance(e, EndpointError)  # an infrastructure fault: dropped and counted
        str(e).encode("utf-8")  # the message itself is printable
        return
    _well_formed(reply)


@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes(body: bytes) -> None:
    _parse(body)


@FUZZ
@given(json_values)
def test_random_json_documents(value: Any) -> None:
    _parse(json.dumps(value))


@FUZZ
@given(
    message=st.dictionaries(
        st.sampled_from(["role", "content", "tool_calls", "refusal", "name"]), json_values
    ),
    finish=json_values,
    usage=json_values,
)
def test_random_values_in_every_field_of_the_envelope(
    message: dict[str, Any], finish: Any, usage: Any
) -> None:
    body = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    _parse(json.dumps({**body, "usage": usage}))


@FUZZ
@given(
    name=json_values,
    arguments=json_values,
    call_id=json_values,
    entry_extra=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
def test_random_tool_calls(name: Any, arguments: Any, call_id: Any, entry_extra: Any) -> None:
    entry = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    message = {"content": None, "tool_calls": [{**entry_extra, **entry}, entry_extra]}
    _parse(json.dumps({"choices": [{"message": message}]}))


@FUZZ
@given(
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1),
    st.sampled_from(["content", "finish", "name", "arguments", "id", "tool_calls"]),
)
def test_lone_surrogates_anywhere(bad: str, where: str) -> None:
    call = {"id": "c", "function": {"name": "f", "arguments": "{}"}}
    message: dict[str, Any] = {"content": "ok", "tool_calls": [call]}
    choice: dict[str, Any] = {"message": message}
    if where == "content":
        message["content"] = bad
    elif where == "finish":
        choice["finish_reason"] = bad
    elif where == "tool_calls":
        message["tool_calls"] = bad
    else:
        key = {"name": "name", "arguments": "arguments"}.get(where)
        if key:
            call["function"][key] = bad
        else:
            call["id"] = bad
    body = json.dumps({"choices": [choice]})  # ensure_ascii: the surrogates travel as \\udXXX
    _parse(body)
    _parse(body.encode())


@pytest.mark.parametrize("depth", [10, 500, 5_000, 200_000])
@pytest.mark.parametrize("where", ["body", "content_list", "tool_calls", "entry", "usage"])
def test_deep_nesting_is_a_reply_or_an_error_never_a_crash(depth: int, where: str) -> None:
    deep = "[" * depth + "]" * depth
    bodies = {
        "body": deep,
        "content_list": f'{{"choices": [{{"message": {{"content": {deep}}}}}]}}',
        "tool_calls": f'{{"choices": [{{"message": {{"tool_calls": {deep}}}}}]}}',
        "entry": f'{{"choices": [{{"message": {{"tool_calls": [{{"function": {deep}}}]}}}}]}}',
        "usage": f'{{"choices": [{{"message": {{"content": "x"}}}}], "usage": {deep}}}',
    }
    _parse(bodies[where])


@pytest.mark.parametrize("size", [1 << 20, 8 << 20])
def test_huge_values(size: int) -> None:
    reply = parse_chat_completion(json.dumps({"choices": [{"message": {"content": "x" * size}}]}))
    assert len(reply.text) == size
    _parse(b'{"choices": [{"message": {"content": "' + b"\xff" * size + b'"}}]}')


def test_what_is_a_malformed_reply_and_what_is_a_malformed_tool_call() -> None:
    def reply(message: Any, **extra: Any) -> ChatReply:
        return parse_chat_completion(json.dumps({"choices": [{"message": message}], **extra}))

    call = {"id": "c1", "function": {"name": "calc", "arguments": '{"x": 1}'}}
    ok = reply(
        {"content": None, "tool_calls": [call]}, usage={"prompt_tokens": 3, "completion_tokens": 4}
    )
    assert ok.tool_calls == (ToolCall("calc", '{"x": 1}', "c1"),) and ok.text == ""
    assert ok.usage == {"prompt_tokens": 3, "completion_tokens": 4}
    assert reply({"content": "hi", "tool_calls": []}).tool_calls is None  # env parses text
    missing = reply({"tool_calls": [{"function": {"name": "calc"}}]}).tool_calls
    assert missing == (ToolCall("calc", "{}", ""),)  # no arguments: an empty object

    # The model's mistakes: each malformed call is kept, with an empty name and its raw text.
    for bad in (
        {"id": None, "function": {"name": None, "arguments": None}},
        {"function": {"name": "", "arguments": "{}"}},
        {"function": {"name": 7, "arguments": "{}"}},
        {"id": "c1"},
        "calc",
    ):
        got = reply({"content": None, "tool_calls": [bad, call]})
        assert got.tool_calls is not None and got.malformed_tool_calls == 1
        assert got.tool_calls[0] == ToolCall("", json.dumps(bad))
        assert got.tool_calls[1].name == "calc"
    assert reply({"tool_calls": "calc(1)"}).tool_calls == (ToolCall("", "calc(1)"),)
    shaped = reply({"tool_calls": {"name": "calc"}}).tool_calls
    assert shaped == (ToolCall("", '{"name": "calc"}'),)

    # The server's: the reply is malformed.
    for message, extra, match in (
        (None, {}, "message is a null"),
        ({"content": 5}, {}, "content is a int"),
        ({"content": ["a"]}, {}, "content is a list"),
        ({"tool_calls": [{"function": {"name": "calc", "arguments": {}}}]}, {}, "JSON string"),
        ({"tool_calls": [{"id": 3, "function": {"name": "calc"}}]}, {}, "id is a int"),
        ({"content": "x"}, {"usage": {"prompt_tokens": None}}, "prompt_tokens"),
        ({"content": "x"}, {"usage": {"prompt_tokens": 1, "completion_tokens": True}}, "count"),
    ):
        with pytest.raises(MalformedResponseError, match=match):
            reply(message, **extra)
    for body, match in (
        (b"", "empty"),
        (b"nope", "not JSON"),
        (b"\xff", "not UTF-8"),
        (b"[1]", "a JSON list"),
        (b'{"choices": []}', "choices is empty"),
        (b'{"id": "x"}', "choices is missing"),
        (b'{"error": {"message": "overloaded"}}', "overloaded"),
        (b'{"choices": [{"message": {"content": "\\ud800"}}]}', "surrogate"),
    ):
        with pytest.raises(MalformedResponseError, match=match):
            parse_chat_completion(body)
