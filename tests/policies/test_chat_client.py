"""The chat client against a strict fake of the OpenAI API: spec-clean requests, retries, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from areal_agents.errors import ConfigError, EndpointError
from areal_agents.net import free_port
from areal_agents.policies.chat_client import ChatPolicy
from areal_agents.types import Message, ToolSpec
from tests.policies.fake_openai import FakeOpenAI

TOOLS = [ToolSpec("lookup", "Look a word up.", {"type": "object", "properties": {}})]


def _script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    if messages[-1]["role"] == "user":
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": "{}"},
        }
        return {"content": None, "tool_calls": [call]}
    return {"content": f"done after {len(messages)} messages"}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # the client reads its key from here
    monkeypatch.delenv("AREAL_API_KEY", raising=False)
    with FakeOpenAI(_script).running() as server:
        yield server


def _policy(fake: FakeOpenAI, **kwargs: Any) -> ChatPolicy:
    return ChatPolicy(fake.base_url, "scripted", backoff_s=0.01, **kwargs)


def test_structured_tool_calls_and_a_spec_clean_conversation(fake: FakeOpenAI) -> None:
    policy = _policy(fake, max_tokens=32)
    convo = [Message.system("sys"), Message.user("Look up 'cat'.")]
    turn = asyncio.run(policy.act(convo, TOOLS))
    assert turn.tool_calls is not None and turn.tool_calls[0].name == "lookup"
    assert turn.tool_calls[0].id == "call_1" and turn.finish_reason == "tool_calls"
    assert turn.usage == {"prompt_tokens": 11, "completion_tokens": 7}
    convo += [Message.from_turn(turn), Message.tool("a small animal", "call_1", "lookup")]
    final = asyncio.run(policy.act(convo, TOOLS))
    assert final.text == "done after 4 messages" and final.tool_calls is None
    sent = fake.requests[-1]
    assert sent["tools"][0]["function"]["name"] == "lookup" and sent["tool_choice"] == "auto"
    assert sent["messages"][2]["tool_calls"][0]["function"]["arguments"] == "{}"


def test_transient_failures_are_retried_with_backoff(fake: FakeOpenAI) -> None:
    fake.failures = [503, 429, 500]
    turn = asyncio.run(_policy(fake, max_retries=3).act([Message.user("hi")], []))
    assert turn.tool_calls is not None  # the fourth attempt answered
    assert fake.failures == [] and len(fake.requests) == 1


def test_persistent_failures_raise_a_typed_error(fake: FakeOpenAI) -> None:
    fake.failures = [502] * 3
    with pytest.raises(EndpointError, match="after 3 attempts"):
        asyncio.run(_policy(fake, max_retries=2).act([Message.user("hi")], []))


def test_client_errors_are_not_retried(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        asyncio.run(ChatPolicy(fake.base_url, "other-model").act([Message.user("hi")], []))
    with pytest.raises(EndpointError, match="answered 400"):  # a tool message answering nothing
        asyncio.run(_policy(fake).act([Message.user("hi"), Message.tool("x", "nope")], []))
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    with pytest.raises(ConfigError, match="API key"):
        asyncio.run(_policy(fake).act([Message.user("hi")], []))
    assert fake.requests == []


def test_unreachable_and_slow_endpoints_become_endpoint_errors(fake: FakeOpenAI) -> None:
    port = free_port()  # nothing listens on it
    policy = ChatPolicy(f"http://127.0.0.1:{port}/v1", "scripted", max_retries=1, backoff_s=0.01)
    with pytest.raises(EndpointError, match="failed after 2 attempts"):
        asyncio.run(policy.act([Message.user("hi")], []))
    fake.delay_s = 2.0
    slow = _policy(fake, max_retries=1, timeout=0.3)
    with pytest.raises(EndpointError, match=r"TimeoutError: no complete reply within 0\.3 s"):
        asyncio.run(slow.act([Message.user("hi")], []))


def test_concurrency_is_bounded(fake: FakeOpenAI) -> None:
    fake.delay_s = 0.2
    policy = _policy(fake, max_concurrency=2)

    async def many() -> None:
        await asyncio.gather(*(policy.act([Message.user(str(i))], []) for i in range(6)))

    asyncio.run(many())
    assert len(fake.requests) == 6 and fake.max_in_flight == 2
