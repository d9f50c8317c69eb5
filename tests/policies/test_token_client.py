"""The token client keeps the token prefix itself; the conversation names turns by id only."""

from __future__ import annotations

import gc
from typing import Any

from areal_agents.policies.templates import render_prompt_ids
from areal_agents.policies.token_client import TokenPolicy, prompt_ids_for
from areal_agents.types import Message, Turn


def test_the_next_prompt_extends_the_sampled_ids_found_by_turn_id(tokenizer: Any) -> None:
    opening = [Message.user("Say hi.")]
    prompt = render_prompt_ids(tokenizer, opening, [])
    # ids that decode to "hi" but are not what re-tokenising "hi" gives: only the client knows
    sampled = tuple(tokenizer.encode("h", add_special_tokens=False)) + tuple(
        tokenizer.encode("i", add_special_tokens=False)
    )
    assert list(sampled) != tokenizer.encode("hi", add_special_tokens=False)
    turn = Turn("hi", id="turn-1", completion_ids=sampled, prompt_ids=tuple(prompt))
    conversation = [*opening, Message.from_turn(turn), Message.user("Again.")]

    ids = prompt_ids_for(tokenizer, conversation, [], {"turn-1": turn})
    assert ids[: len(prompt) + len(sampled)] == [*prompt, *sampled]
    assert tokenizer.decode(ids[len(prompt) + len(sampled) :]).endswith(
        "user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    )
    # a turn this client does not know (another client's, or dropped): the text is rendered
    rendered = prompt_ids_for(tokenizer, conversation, [], {})
    assert rendered == render_prompt_ids(tokenizer, conversation, [])
    assert rendered[: len(prompt) + len(sampled)] != [*prompt, *sampled]


def test_the_client_holds_turns_only_while_the_caller_does(tokenizer: Any) -> None:
    policy = TokenPolicy("http://127.0.0.1:9/v1", "m", tokenizer)
    turn = policy._keep(Turn("x", id="t", completion_ids=(1,), prompt_ids=(2,)))
    assert policy.sampled["t"] is turn
    del turn
    gc.collect()
    assert "t" not in policy.sampled  # an ended episode leaves nothing behind


def test_a_missing_log_prob_is_an_endpoint_error_not_zero(tokenizer: Any) -> None:
    """A completion token without its log-prob cannot be trained on: the episode is dropped
    (an infrastructure fault), never given a behaviour log-prob of 0.0 (probability 1)."""
    import asyncio
    from types import SimpleNamespace

    import pytest

    from areal_agents.errors import EndpointError

    def reply(logprobs: list[float | None]) -> Any:
        choice = SimpleNamespace(
            model_extra={"token_ids": [11, 12, 13]},
            logprobs=SimpleNamespace(token_logprobs=logprobs),
            finish_reason="stop",
        )
        return SimpleNamespace(choices=[choice], usage=None)

    policy = TokenPolicy("http://127.0.0.1:9/v1", "m", tokenizer)
    policy.max_model_len = 0  # unknown: nothing to ask the endpoint

    async def act(logprobs: list[float | None]) -> Turn:
        async def complete(prompt: list[int], max_tokens: int) -> tuple[Any, int]:
            return reply(logprobs), 0

        policy._complete = complete  # type: ignore[method-assign]
        return await policy.act([Message.user("hi")], [])

    turn = asyncio.run(act([-0.1, -0.2, -0.3]))
    assert turn.behavior_logprobs == pytest.approx((-0.1, -0.2, -0.3))
    with pytest.raises(EndpointError, match="log-prob"):
        asyncio.run(act([-0.1, None, -0.3]))
