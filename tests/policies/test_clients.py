"""The same client tests against the built-in server and against real vLLM (``vllm`` marker).

Both engines serve the offline default model; each is started once per module. Everything
goes through the official ``openai`` client or this package's clients.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import gymnasium as gym
import openai
import pytest

from areal_agents.policies.chat_client import ChatPolicy
from areal_agents.policies.token_client import TokenPolicy
from areal_agents.rollout import run_episode
from areal_agents.types import Message, ToolCall, ToolSpec, Turn
from tests.conftest import teacher_forced_logprobs

pytestmark = pytest.mark.integration

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def few_shot_tool_conversation() -> list[dict[str, Any]]:
    """Three worked examples of calling the calculator, then a new question.

    A 135M model does not call tools unprompted; after these examples it does (greedy).
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Always call the calculator tool first."}
    ]
    for i, (question, answer) in enumerate([("3 + 4", "7"), ("10 * 5", "50"), ("8 - 2", "6")]):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": question})},
        }
        messages += [
            {"role": "user", "content": f"What is {question}?"},
            {"role": "assistant", "content": "I will use the calculator.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": answer},
            {"role": "assistant", "content": f"\\boxed{{{answer}}}"},
        ]
    return [*messages, {"role": "user", "content": "What is 12 * 7?"}]


def _greedy(client: openai.OpenAI, server: Any, prompt: Any, n: int = 6) -> Any:
    return client.completions.create(
        model=server.served_model_name,
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        logprobs=0,
        extra_body={"return_token_ids": True},
    )


def test_models_lists_the_served_model(client: openai.OpenAI, server: Any) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [server.served_model_name]
    assert (models.data[0].model_extra or {})["max_model_len"] == 2048


def test_chat_completion(client: openai.OpenAI, server: Any) -> None:
    response = client.chat.completions.create(
        model=server.served_model_name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    choice = response.choices[0]
    assert "Paris" in (choice.message.content or "")
    assert choice.finish_reason in ("stop", "length")
    assert choice.logprobs is not None and choice.logprobs.content
    first = choice.logprobs.content[0]
    assert len(first.top_logprobs) == 2 and first.logprob <= 0.0
    assert first.top_logprobs[0].logprob >= first.top_logprobs[1].logprob
    token_ids = (choice.model_extra or {})["token_ids"]
    assert response.usage is not None and response.usage.completion_tokens == len(token_ids)
    prompt_ids = (response.model_extra or {})["prompt_token_ids"]
    assert len(prompt_ids) == response.usage.prompt_tokens


def test_chat_sampling_n_and_seed(client: openai.OpenAI, server: Any) -> None:
    def sample(seed: int) -> list[str]:
        response = client.chat.completions.create(
            model=server.served_model_name,
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=8,
            temperature=1.0,
            n=3,
            seed=seed,
        )
        return [c.message.content or "" for c in response.choices]

    first = sample(7)
    assert len(first) == 3 and len(set(first)) > 1  # three different samples
    assert sample(7) == first  # a seed makes sampling repeatable


def test_hermes_tool_calls_come_back_structured(client: openai.OpenAI, server: Any) -> None:
    response = client.chat.completions.create(
        model=server.served_model_name,
        messages=few_shot_tool_conversation(),  # type: ignore[arg-type]
        tools=[CALCULATOR],  # type: ignore[list-item]
        max_tokens=48,
        temperature=0,
    )
    message = response.choices[0].message
    assert message.tool_calls, message.content
    call = message.tool_calls[0]
    assert call.function.name == "calculator"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"expression": "12 * 7"}  # type: ignore[union-attr]
    assert "<tool_call>" not in (message.content or "")


def test_completions_return_token_ids_and_logprobs(
    client: openai.OpenAI, server: Any, tokenizer: Any, hf_model: Any
) -> None:
    prompt = tokenizer.encode("The capital of France is", add_special_tokens=False)
    response = _greedy(client, server, prompt)
    choice = response.choices[0]
    extra = choice.model_extra or {}
    assert extra["prompt_token_ids"] == prompt
    ids = extra["token_ids"]
    assert len(ids) == 6 and tokenizer.decode(ids).startswith(" Paris")
    assert choice.logprobs is not None
    logprobs = choice.logprobs.token_logprobs
    assert logprobs is not None and len(logprobs) == len(ids)
    expected = teacher_forced_logprobs(hf_model, prompt + ids)[len(prompt) - 1 :]
    assert logprobs == pytest.approx(expected, abs=2e-3)
    assert _greedy(client, server, prompt).choices[0].model_extra["token_ids"] == ids  # type: ignore[index]


def test_bad_requests_get_clear_4xx_errors(client: openai.OpenAI, server: Any) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match=r"context length|max_model_len"):
        client.completions.create(model=server.served_model_name, prompt="hi", max_tokens=5000)
    if server.kind == "builtin":  # vLLM accepts some malformed schemas until it must use them
        bad_tool = {"type": "function", "function": {"name": "bad name!", "parameters": {}}}
        with pytest.raises(openai.BadRequestError, match="name"):
            client.chat.completions.create(
                model=server.served_model_name,
                messages=[{"role": "user", "content": "hi"}],
                tools=[bad_tool],  # type: ignore[list-item]
                max_tokens=2,
            )


class _Conversation(gym.Env[Any, Any]):
    """A user environment with three assistant turns: a tool result, a user reply, the end."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.turns = 0
        return [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name a fruit."},
        ], {"task_id": "fruit"}

    def step(self, action: Turn) -> Any:
        self.turns += 1
        if self.turns == 1:
            obs = [{"role": "tool", "content": "apple, pear", "tool_call_id": "t0"}]
        else:
            obs = [{"role": "user", "content": "Name another one."}]
        return obs, float(self.turns == 3), self.turns == 3, False, {}


async def _episode(server: Any, tokenizer: Any) -> Any:
    policy = TokenPolicy(
        server.base_url, server.served_model_name, tokenizer, temperature=0.0, max_tokens=12
    )
    return await run_episode(_Conversation(), policy, seed=0)


def test_token_client_multi_turn_episode_reproduces_the_servers_tokens(
    client: openai.OpenAI, server: Any, tokenizer: Any, hf_model: Any
) -> None:
    episode = asyncio.run(_episode(server, tokenizer))
    turns = episode.turns
    assert len(turns) == 3
    # Each prompt extends the previous prompt + the sampled ids exactly (no re-tokenisation).
    for before, after in itertools.pairwise(turns):
        context = (*before.prompt_ids, *before.completion_ids)  # type: ignore[misc]
        assert after.prompt_ids[: len(context)] == context  # type: ignore[index]
    trajectory = episode.to_trajectory(group_id="g")
    assert trajectory.num_policy_tokens == sum(len(t.completion_ids or ()) for t in turns)
    text = tokenizer.decode(trajectory.sequence_ids)
    assert "<tool_response>\napple, pear\n</tool_response>" in text
    assert "<|im_start|>user\nName another one.<|im_end|>" in text
    # Asked again with each turn's prompt, the server generates exactly the same ids...
    for turn in turns:
        again = _greedy(client, server, list(turn.prompt_ids or ()), n=12)
        assert (again.choices[0].model_extra or {})["token_ids"] == list(turn.completion_ids or ())
    # ...and the behaviour logprobs are the model's own on the joined sequence.
    expected = teacher_forced_logprobs(hf_model, list(trajectory.sequence_ids))
    policy_positions = [i for i, m in enumerate(trajectory.loss_mask) if m]
    got = [trajectory.behavior_logprobs[i] for i in policy_positions]
    assert got == pytest.approx([expected[i - 1] for i in policy_positions], abs=2e-3)


def test_chat_policy_returns_structured_tool_calls(server: Any) -> None:
    policy = ChatPolicy(server.base_url, server.served_model_name, temperature=0, max_tokens=48)
    convo = [Message.from_openai(m) for m in few_shot_tool_conversation()]
    turn = asyncio.run(policy.act(convo, [ToolSpec.from_openai(CALCULATOR)]))
    assert turn.tool_calls is not None
    assert turn.tool_calls[0].name == "calculator"
    assert isinstance(turn.tool_calls[0], ToolCall) and turn.usage is not None


def _collect(stream: Any) -> tuple[list[Any], dict[int, str], dict[int, dict[int, dict[str, str]]]]:
    """All chunks of a chat stream, the content per choice, and the tool calls per choice (the
    deltas of each call index joined, as a client must)."""
    chunks, content = list(stream), {}
    calls: dict[int, dict[int, dict[str, str]]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            content[choice.index] = content.get(choice.index, "") + (choice.delta.content or "")
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(choice.index, {}).setdefault(
                    delta.index, {"id": "", "name": "", "arguments": ""}
                )
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return chunks, content, calls


def test_streamed_chat_matches_the_whole_answer_and_reports_usage(
    client: openai.OpenAI, server: Any
) -> None:
    request: dict[str, Any] = {
        "model": server.served_model_name,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request)
    chunks, content, calls = _collect(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    assert content == {0: whole.choices[0].message.content} and not calls
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # pieces
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    usage_chunk = chunks[-1]  # include_usage: a last chunk with the usage and no choices
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert whole.usage is not None
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_tool_calls_arrive_as_tool_call_deltas(client: openai.OpenAI, server: Any) -> None:
    request: dict[str, Any] = {
        "model": server.served_model_name,
        "messages": few_shot_tool_conversation(),
        "tools": [CALCULATOR],
        "max_tokens": 48,
        "temperature": 0,
    }
    chunks, content, calls = _collect(client.chat.completions.create(**request, stream=True))
    (call,) = calls[0].values()
    assert call["name"] == "calculator" and call["id"]
    assert json.loads(call["arguments"]) == {"expression": "12 * 7"}
    assert "<tool_call>" not in content[0]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # the openai client's streaming helper assembles the same message
    with client.chat.completions.stream(**request) as stream:
        events = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    message = final.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "calculator"  # type: ignore[union-attr]
    assert json.loads(message.tool_calls[0].function.arguments) == {"expression": "12 * 7"}  # type: ignore[union-attr]


def test_streamed_choices_and_completions(client: openai.OpenAI, server: Any) -> None:
    chunks, content, _ = _collect(
        client.chat.completions.create(
            model=server.served_model_name,
            messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=6,
            temperature=1.0,
            seed=3,
            n=2,
            stream=True,
        )
    )
    assert set(content) == {0, 1} and all(content.values())  # two choices, each with text
    finished = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1]  # each choice ends once
    request: dict[str, Any] = {
        "model": server.served_model_name,
        "prompt": "The capital of France is",
        "max_tokens": 6,
        "temperature": 0,
    }
    whole = client.completions.create(**request)
    chunks = list(
        client.completions.create(**request, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streaming_requests_that_are_refused(client: openai.OpenAI, server: Any) -> None:
    with pytest.raises(openai.BadRequestError, match=r"(?i)stream_options|stream options"):
        client.chat.completions.create(
            model=server.served_model_name,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            stream_options={"include_usage": True},
        )
    with pytest.raises(openai.BadRequestError, match=r"context length|max_model_len"):
        client.completions.create(  # refused before any event is sent
            model=server.served_model_name, prompt="hi", max_tokens=5000, stream=True
        )
    if server.kind == "builtin":  # vLLM streams logprobs; the built-in server says it does not
        with pytest.raises(openai.BadRequestError, match="logprobs"):
            client.chat.completions.create(
                model=server.served_model_name,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                logprobs=True,
                stream=True,
            )
