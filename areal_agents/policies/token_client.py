"""The token client: a :class:`~areal_agents.policies.base.Policy` for training.

Token ids in, token ids out, through ``/v1/completions`` with a token-id prompt and the fields
vLLM's OpenAI server uses for RL (``return_token_ids``: per-choice ``token_ids``;
``logprobs``: per-token ``token_logprobs``). Both vLLM and the built-in server speak them.

The conversation is rendered once with the model's chat template (with tools). On every later
turn the prompt is the previous turn's prompt + its sampled ids + the template's tokens for the
new tool/user messages (:func:`~areal_agents.policies.templates.continuation_ids`), so each
turn's ``prompt_ids`` extends the last exactly and
:meth:`~areal_agents.types.Trajectory.from_turns` can join them: training sees exactly the
tokens the policy produced. The token prefix stays in the client: it keeps each turn it produced
(weakly, for as long as the caller holds the :class:`~areal_agents.types.Turn`, as
:func:`~areal_agents.rollout.run_episode` does) under :attr:`Turn.id`, and the conversation
refers to it only by that id (``Message.turn_id``), never by its token ids. Tool calls stay in
the text in the model's own format; the environment parses them (and counts malformed ones as
the model's mistakes).

Each response's tokens get the weight version the server reports with that response
(:func:`~areal_agents.policies.versions.response_version`: a generation that overlapped an
update gets the older version). If a weight update interrupts a generation
(``finish_reason="abort"``), the client continues it from where it stopped, under the new
weights, and tags those tokens with the new version.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from areal_agents.errors import EndpointError
from areal_agents.policies.openai_client import ClientSettings, EndpointClient
from areal_agents.policies.templates import ChatTokenizer, continuation_ids, render_prompt_ids
from areal_agents.policies.versions import response_version
from areal_agents.types import Message, ToolSpec, Turn

__all__ = ["ABORT_FINISH_REASON", "TokenPolicy", "prompt_ids_for"]

#: The finish reason of a generation interrupted by a pause/weight update (vLLM's, too).
ABORT_FINISH_REASON = "abort"


def prompt_ids_for(
    tokenizer: ChatTokenizer,
    conversation: Sequence[Message],
    tools: Sequence[ToolSpec],
    sampled: Mapping[str, Turn],
) -> list[int]:
    """The prompt token ids for the next turn, reusing the ids of the last sampled turn.

    ``sampled`` maps :attr:`Turn.id` to the turns this client produced; the last assistant
    message found in it (by ``Message.turn_id``) gives the prefix. Without one the whole
    conversation is rendered.
    """
    for index in range(len(conversation) - 1, -1, -1):
        message = conversation[index]
        if message.role != "assistant" or not message.turn_id:
            continue
        turn = sampled.get(message.turn_id)
        if turn is None:
            continue
        if turn.prompt_ids is None or turn.completion_ids is None:
            continue
        base = [*turn.prompt_ids, *turn.completion_ids]
        tail = continuation_ids(
            tokenizer,
            conversation[: index + 1],
            conversation[index + 1 :],
            tools,
            sampled_ids=turn.completion_ids,
        )
        return base + tail
    return render_prompt_ids(tokenizer, conversation, tools)


class TokenPolicy:
    """Take turns through ``/v1/completions`` with token-id prompts; returns token-level turns.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000/v1`` (vLLM or built-in).
        model: the served model name.
        tokenizer: the model's Hugging Face tokenizer (renders the chat template).
        temperature, top_p, max_tokens: sampling; ``max_tokens`` is cut to the context left.
        stop: stop strings; extra_body: more request fields (``{"ignore_eos": True}``).
        version_source: where the weight version comes from when a response carries none
            (an endpoint other than the built-in server or vLLM started by the launcher, which
            send it: :mod:`areal_agents.policies.versions`); default 0.
        max_model_len: the server's context length (None asks ``/v1/models`` once).
        max_continuations: how many times an aborted generation is continued.
        timeout, max_retries, backoff_s, max_concurrency, api_key: see :class:`ClientSettings`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        extra_body: Mapping[str, Any] | None = None,
        version_source: Callable[[], int] | None = None,
        max_model_len: int | None = None,
        max_continuations: int = 16,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_concurrency: int = 64,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.stop = list(stop)
        self.extra_body = {**(extra_body or {}), "return_token_ids": True}
        self.version_source = version_source
        self.max_model_len = max_model_len
        self.max_continuations = max_continuations
        #: Turn.id -> the turn, while its caller holds it (the token prefix of a conversation)
        self.sampled: weakref.WeakValueDictionary[str, Turn] = weakref.WeakValueDictionary()
        self.endpoint = EndpointClient(
            ClientSettings(
                base_url=base_url,
                api_key=api_key,
                timeout=timeout,
                max_retries=max_retries,
                backoff_s=backoff_s,
                max_concurrency=max_concurrency,
            )
        )

    async def _context_length(self) -> int | None:
        if self.max_model_len is None:
            models = await self.endpoint.call("list models", lambda c: c.models.list())
            for card in models.data:
                if card.id == self.model:
                    extra = card.model_extra or {}
                    if extra.get("max_model_len"):
                        self.max_model_len = int(extra["max_model_len"])
                    break
            if self.max_model_len is None:
                self.max_model_len = 0  # unknown: do not cut max_tokens
        return self.max_model_len or None

    async def _complete(self, prompt: list[int], max_tokens: int) -> tuple[Any, int]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": 0,
        }
        if self.stop:
            body["stop"] = self.stop
        raw = await self.endpoint.call(
            "completion",
            lambda c: c.completions.with_raw_response.create(**body, extra_body=self.extra_body),
        )
        response = raw.parse()
        extra = response.model_extra or {}
        # from the response (body, or the servers' version headers), never read afterwards
        version = response_version(raw.headers, extra.get("weight_version"))
        if version is None:
            version = self.version_source() if self.version_source is not None else 0
        return response, int(version)

    async def aclose(self) -> None:
        """Close this event loop's connections to the endpoint (:meth:`EndpointClient.aclose`)."""
        await self.endpoint.aclose()

    async def act(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> Turn:
        prompt_ids = prompt_ids_for(self.tokenizer, conversation, tools, self.sampled)
        budget = self.max_tokens
        limit = await self._context_length()
        if limit is not None:
            budget = min(budget, limit - len(prompt_ids))
        if budget <= 0:  # the context is full: an empty turn that ends the episode
            return self._keep(
                Turn(
                    text="",
                    id=uuid.uuid4().hex,
                    completion_ids=(),
                    behavior_logprobs=(),
                    versions=(),
                    prompt_ids=tuple(prompt_ids),
                    finish_reason="length",
                )
            )
        completion_ids: list[int] = []
        behavior_logprobs: list[float] = []
        versions: list[int] = []
        finish: str | None = ABORT_FINISH_REASON
        continuations = 0
        usage_prompt = 0
        while finish == ABORT_FINISH_REASON and len(completion_ids) < budget:
            if continuations > self.max_continuations:
                raise EndpointError(
                    f"generation was interrupted {continuations} times in a row; giving up"
                )
            continuations += 1
            response, version = await self._complete(
                prompt_ids + completion_ids, budget - len(completion_ids)
            )
            choice = response.choices[0]
            extra = choice.model_extra or {}
            chunk_ids = extra.get("token_ids")
            if chunk_ids is None:
                raise EndpointError(
                    "the endpoint returned no token_ids: it does not support return_token_ids "
                    "(use vLLM or the built-in server for token-level rollouts)"
                )
            chunk_logprobs = list(choice.logprobs.token_logprobs) if choice.logprobs else []
            if len(chunk_logprobs) != len(chunk_ids):
                raise EndpointError(
                    f"the endpoint returned {len(chunk_ids)} token ids but "
                    f"{len(chunk_logprobs)} logprobs"
                )
            if any(lp is None for lp in chunk_logprobs):
                # a token without its log-prob cannot be trained on (0.0 would claim p = 1)
                missing = [i for i, lp in enumerate(chunk_logprobs) if lp is None]
                raise EndpointError(
                    f"the endpoint returned no log-prob for {len(missing)} of {len(chunk_ids)} "
                    f"completion tokens (first at {missing[0]})"
                )
            completion_ids.extend(int(t) for t in chunk_ids)
            behavior_logprobs.extend(float(lp) for lp in chunk_logprobs)
            versions.extend([version] * len(chunk_ids))
            finish = choice.finish_reason
            if response.usage is not None and not usage_prompt:
                usage_prompt = int(response.usage.prompt_tokens)
        if finish == ABORT_FINISH_REASON:  # the budget ran out exactly at the interruption
            finish = "length"
        return self._keep(
            Turn(
                text=self.tokenizer.decode(completion_ids, skip_special_tokens=True),
                tool_calls=None,
                id=uuid.uuid4().hex,
                completion_ids=tuple(completion_ids),
                behavior_logprobs=tuple(behavior_logprobs),
                versions=tuple(versions),
                prompt_ids=tuple(prompt_ids),
                finish_reason=finish,
                usage={
                    "prompt_tokens": usage_prompt or len(prompt_ids),
                    "completion_tokens": len(completion_ids),
                },
            )
        )

    def _keep(self, turn: Turn) -> Turn:
        self.sampled[turn.id] = turn
        return turn
