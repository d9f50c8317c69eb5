"""Reasoning content: kept in turns and transcripts; ``keep_reasoning`` decides what of earlier
turns' reasoning the chat client sends back; the token path is untouched by it.

The endpoint is the strict fake of the OpenAI API (``fake_openai.py``), scripted as a server
with a reasoning parser: it returns ``reasoning_content`` apart from ``content``. The fake
refuses any field the OpenAI request spec lacks, so every request here is also spec-clean.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from areal_agents.errors import MalformedResponseError
from areal_agents.policies.chat_client import ChatPolicy
from areal_agents.policies.chat_response import parse_chat_completion
from areal_agents.policies.templates import render_prompt_ids
from areal_agents.rollout import run_episode
from areal_agents.types import Message, Turn
from tests.policies.fake_openai import FakeOpenAI

THOUGHT = "The user wants a word looked up."


def _script(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    if messages[-1]["role"] == "user":
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": "{}"},
        }
        return {"content": "Looking it up.", "reasoning_content": THOUGHT, "tool_calls": [call]}
    return {"content": "It means a small dog.", "reasoning_content": "The tool answered."}


class _Lookup(gym.Env[Any, Any]):
    """One tool round, then the episode ends."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.turns = 0
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look a word up.",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ]
        return [{"role": "user", "content": "What is a puppy?"}], {"task_id": "w", "tools": tools}

    def step(self, action: Turn) -> Any:
        self.turns += 1
        obs = [{"role": "tool", "tool_call_id": "call_1", "content": "a young dog"}]
        return (obs if self.turns == 1 else []), 1.0, self.turns == 2, False, {}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("AREAL_API_KEY", raising=False)
    with FakeOpenAI(_script).running() as server:
        yield server


def _episode(fake: FakeOpenAI, keep_reasoning: bool) -> Any:
    policy = ChatPolicy(fake.base_url, "scripted", keep_reasoning=keep_reasoning, backoff_s=0.01)
    return asyncio.run(run_episode(_Lookup(), policy, seed=0))


def test_reasoning_content_reaches_turns_and_transcripts(fake: FakeOpenAI) -> None:
    episode = _episode(fake, keep_reasoning=False)
    assert [t.reasoning for t in episode.turns] == [THOUGHT, "The tool answered."]
    assistant = [m for m in episode.to_json()["messages"] if m["role"] == "assistant"]
    assert [m["reasoning_content"] for m in assistant] == [THOUGHT, "The tool answered."]
    assert assistant[0]["content"] == "Looking it up."  # content stays apart from reasoning


def test_keep_reasoning_decides_what_earlier_turns_send_back(fake: FakeOpenAI) -> None:
    _episode(fake, keep_reasoning=False)
    _episode(fake, keep_reasoning=True)
    dropped, kept = (
        next(m for m in r["messages"] if m["role"] == "assistant") for r in fake.requests[1::2]
    )
    assert dropped["content"] == "Looking it up." and THOUGHT not in str(dropped)
    assert kept["content"] == f"<think>\n{THOUGHT}\n</think>\n\nLooking it up."
    assert "reasoning_content" not in kept  # not an OpenAI request field: sent inline


def test_inline_think_spans_follow_the_same_choice(fake: FakeOpenAI) -> None:
    inline = Message("assistant", "<think>\nshort\n</think>\n\nA dog.")
    convo = [Message.user("What is a puppy?"), inline, Message.user("And a kitten?")]
    for keep in (False, True):
        policy = ChatPolicy(fake.base_url, "scripted", keep_reasoning=keep, backoff_s=0.01)
        asyncio.run(policy.act(convo, []))
    dropped, kept = (r["messages"][1]["content"] for r in fake.requests[-2:])
    assert dropped == "A dog." and kept == inline.content


def test_a_malformed_reasoning_field_is_a_malformed_reply() -> None:
    body = '{"choices": [{"message": {"content": "x", "reasoning_content": 5}}]}'
    with pytest.raises(MalformedResponseError, match="reasoning_content"):
        parse_chat_completion(body)
    reply = parse_chat_completion('{"choices": [{"message": {"content": "x", "reasoning": "r"}}]}')
    assert reply.reasoning == "r"  # vLLM's newer field name


def test_the_token_path_renders_the_same_with_or_without_reasoning(model_dir: Path) -> None:
    """The token client extends sampled ids; the prompts it renders for new messages do not
    depend on a ``reasoning_content`` carried by earlier messages."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    plain = [Message.user("Hi"), Message("assistant", "Hello."), Message.user("Bye")]
    with_reasoning = [plain[0], Message("assistant", "Hello.", reasoning_content="greet"), plain[2]]
    assert render_prompt_ids(tok, with_reasoning) == render_prompt_ids(tok, plain)
    assert Message.from_openai(with_reasoning[1].to_openai()) == with_reasoning[1]


def test_eval_key_policy_keep_reasoning_reaches_the_client(fake: FakeOpenAI) -> None:
    from areal_agents.config import load_config
    from areal_agents.eval import _make_policy
    from areal_agents.eval_config import EvalConfig

    inline = Message("assistant", "<think>\nshort\n</think>\n\nA dog.")
    convo = [Message.user("What is a puppy?"), inline, Message.user("And a kitten?")]
    for value in ("false", "true"):
        cfg = load_config(EvalConfig, [f"policy.keep_reasoning={value}"])
        policy = _make_policy(cfg.policy, fake.base_url, "scripted", 0.0)
        asyncio.run(policy.act(convo, []))
    dropped, kept = (r["messages"][1]["content"] for r in fake.requests[-2:])
    assert dropped == "A dog." and kept == inline.content
