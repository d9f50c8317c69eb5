"""How the built-in server turns an OpenAI request into generations, and generations into a reply.

:class:`OpenAIHandler` is what the routes of :mod:`areal_agents.serving.api` call: it checks a
request (sizes first, before any tokenising or queueing: the module docstring of
:mod:`~areal_agents.serving.api` says why), renders and tokenises its prompts off the event loop,
submits them to the :class:`~areal_agents.serving.engine.Engine` and shapes the results as
OpenAI's (and vLLM's RL extensions: token ids, log-probs, the weight version).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from areal_agents.errors import ConfigError
from areal_agents.policies.templates import render_prompt_ids
from areal_agents.serving.engine import Engine, GenerationRequest, GenerationResult
from areal_agents.serving.schema import (
    APIError,
    ChatRequest,
    CompletionRequest,
    SamplingRequest,
    check_messages,
    check_tools,
    parse_hermes_tool_calls,
)
from areal_agents.serving.streaming import (
    Detokenizer,
    TokenStream,
    chat_events,
    completion_events,
)

__all__ = ["DISCONNECT_POLL_S", "OpenAIHandler"]

DISCONNECT_POLL_S = 0.5
"""How often a running non-streaming request checks that its client is still there."""


def _longest_token_chars(tok: Any) -> int:
    """How many characters one token of ``tok`` covers at most (a byte-level BPE token's
    characters are its bytes, which bounds the characters it decodes to)."""
    try:
        pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
        return max(1, *(len(p) for p in pieces if isinstance(p, str)))
    except Exception:  # a tokenizer without a vocabulary to read: no character bound
        return 1 << 30


class OpenAIHandler:
    """The OpenAI routes' work for one engine (see the module docstring)."""

    def __init__(self, engine: Engine, served_name: str, max_sequences: int) -> None:
        self.engine = engine
        self.name = served_name
        self.tok: Any = engine.tokenizer
        self.max_sequences = max_sequences
        # a text of more characters than this cannot fit the context, whatever its tokens
        self.max_chars = engine.max_model_len * _longest_token_chars(self.tok)

    def _check_size(self, sequences: int, chars: int, param: str) -> None:
        """Refuse, before any tokenising or queueing, a request too big to serve."""
        if sequences > self.max_sequences:
            raise APIError(
                400,
                f"the request asks for {sequences} sequences (prompts x n); this server takes "
                f"at most {self.max_sequences} per request (--max-request-sequences)",
                param="n",
            )
        if chars > self.max_chars:
            raise APIError(
                400,
                f"This model's maximum context length is {self.engine.max_model_len} tokens. "
                f"However, your request has {chars} characters, more than that many tokens "
                "can hold.",
                param=param,
            )

    def _check_common(self, req: SamplingRequest) -> None:
        if req.model != self.name:
            raise APIError(
                404,
                f"The model `{req.model}` does not exist. Valid aliases: {self.name}.",
                "NotFoundError",
                "model",
            )
        if req.stream_options is not None and not req.stream:
            raise APIError(
                400, "stream_options can only be given with stream=true", param="stream_options"
            )
        logprobs = getattr(req, "logprobs", None)  # chat: a bool; completions: 0..20 or None
        wants_logprobs = logprobs is not None and logprobs is not False
        if req.stream and (wants_logprobs or req.return_token_ids):
            raise APIError(
                400,
                "the built-in server does not stream logprobs or token ids: drop stream=true",
                param="stream",
            )

    def _requests(
        self,
        req: SamplingRequest,
        prompt: list[int],
        max_tokens: int | None,
        top: int,
        prefix: tuple[int, ...],
    ) -> list[GenerationRequest]:
        room = self.engine.max_model_len - len(prompt)
        if room <= 0:
            raise APIError(
                400,
                f"This model's maximum context length is {self.engine.max_model_len} tokens. "
                f"However, your request has {len(prompt)} input tokens.",
                param="messages",
            )
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        return [
            GenerationRequest(
                prompt_ids=prompt,
                max_tokens=max_tokens if max_tokens is not None else room,
                temperature=req.temperature,
                top_p=req.top_p,
                stop_token_ids=frozenset(req.stop_token_ids or ()),
                stop=stop,
                seed=None if req.seed is None else req.seed + i,
                top_logprobs=top,
                forced_prefix=prefix,
                ignore_eos=req.ignore_eos,
            )
            for i in range(req.n)
        ]

    async def _generate(
        self,
        requests: list[GenerationRequest],
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> list[GenerationResult]:
        """Run ``requests`` in the engine. While they run, ``disconnected`` (the HTTP request's
        own check) is polled: once the client has gone (its timeout, then a retry), the requests
        are cancelled and leave the batch at its next step, instead of decoding to the end for
        nobody while the retry competes with them (under load, that feedback stalls a server)."""
        try:
            futures = [self.engine.submit(r) for r in requests]
        except ConfigError as e:
            raise APIError(400, str(e)) from None
        results = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        while disconnected is not None:
            done, _ = await asyncio.wait({results}, timeout=DISCONNECT_POLL_S)
            if done:
                break
            if await disconnected():
                for request in requests:
                    request.cancelled = True
                break
        return list(await results)

    def _text(self, ids: list[int], stop_reason: int | str | None) -> str:
        text = self.tok.decode(ids, skip_special_tokens=True)
        if isinstance(stop_reason, str) and stop_reason in text:
            text = text[: text.find(stop_reason)]
        return text

    def _token(self, token_id: int) -> str:
        return self.tok.decode([token_id], skip_special_tokens=False)

    async def _chat_setup(
        self, req: ChatRequest
    ) -> tuple[str | dict[str, Any], list[int], list[GenerationRequest]]:
        """Check a chat request; its tool choice, prompt ids and generation requests."""
        self._check_common(req)
        tools = check_tools(req.tools)
        check_messages(req.messages)
        chars = sum(len(m["content"]) for m in req.messages) + len(str(tools))
        self._check_size(req.n, chars, "messages")
        choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
        prefix_text = ""
        if isinstance(choice, dict):
            name = str((choice.get("function") or {}).get("name"))
            if name not in {t["function"]["name"] for t in tools}:
                raise APIError(
                    400, f"tool_choice names {name!r}, not one of the tools", param="tool_choice"
                )
            prefix_text = '<tool_call>\n{"name": "' + name + '", "arguments": '
        elif choice == "required":
            if not tools:
                raise APIError(400, "tool_choice=required needs tools", param="tool_choice")
            prefix_text = "<tool_call>\n"
        elif choice not in ("auto", "none"):
            raise APIError(400, f"tool_choice={choice!r} is not supported", param="tool_choice")
        use_tools = tools if choice != "none" else []
        try:  # a template (jinja2) or the tokenizer can raise anything on a message it did
            # not expect (a tool call that is not an object, a lone surrogate): the request's fault
            prompt = await asyncio.to_thread(render_prompt_ids, self.tok, req.messages, use_tools)
        except Exception as e:
            raise APIError(400, f"the messages cannot be rendered: {e}", param="messages") from None
        prefix = (
            tuple(self.tok.encode(prefix_text, add_special_tokens=False)) if prefix_text else ()
        )
        top = (req.top_logprobs or 0) if req.logprobs else 0
        limit = req.max_completion_tokens or req.max_tokens
        return choice, prompt, self._requests(req, prompt, limit, top, prefix)

    def _start_stream(self, requests: list[GenerationRequest]) -> TokenStream:
        try:
            return TokenStream(self.engine, requests)
        except ConfigError as e:
            raise APIError(400, str(e)) from None

    async def chat_stream(self, req: ChatRequest) -> AsyncIterator[str]:
        """The events of a ``stream=true`` chat request (checked and submitted already)."""
        choice, prompt, requests = await self._chat_setup(req)
        return chat_events(
            self._start_stream(requests),
            model=self.name,
            detokenizers=[Detokenizer(self.tok, r.stop) for r in requests],
            tools=choice != "none",
            final_text=lambda res: self._text(res.token_ids, res.stop_reason),
            prompt_tokens=len(prompt),
            include_usage=bool((req.stream_options or {}).get("include_usage")),
        )

    async def chat(
        self, req: ChatRequest, disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> dict[str, Any]:
        choice, prompt, requests = await self._chat_setup(req)
        results = await self._generate(requests, disconnected)
        choices = []
        for i, res in enumerate(results):
            text = self._text(res.token_ids, res.stop_reason)
            content, calls = (text, []) if choice == "none" else parse_hermes_tool_calls(text)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            entry: dict[str, Any] = {
                "index": i,
                "message": message,
                "logprobs": self._chat_logprobs(res) if req.logprobs else None,
                "finish_reason": "tool_calls"
                if calls and res.finish_reason == "stop"
                else res.finish_reason,
                "stop_reason": res.stop_reason,
            }
            if req.return_token_ids:
                entry["token_ids"] = res.token_ids
            choices.append(entry)
        out = self._envelope("chat.completion", "chatcmpl", choices, prompt, results)
        if req.return_token_ids:
            out["prompt_token_ids"] = prompt
        return out

    def _chat_logprobs(self, res: GenerationResult) -> dict[str, Any]:
        content = []
        for j, (tid, lp) in enumerate(zip(res.token_ids, res.logprobs, strict=True)):
            text = self._token(tid)
            tops = res.top_logprobs[j] if j < len(res.top_logprobs) else []
            content.append(
                {
                    "token": text,
                    "logprob": lp,
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {"token": (t := self._token(k)), "logprob": v, "bytes": list(t.encode())}
                        for k, v in tops
                    ],
                }
            )
        return {"content": content}

    async def _completion_setup(
        self, req: CompletionRequest
    ) -> tuple[list[list[int]], list[GenerationRequest]]:
        """Check a completion request; its prompts and generation requests."""
        self._check_common(req)
        if req.echo:
            raise APIError(400, "echo=true is not supported by the built-in server", param="echo")
        raw = req.prompt
        prompts: list[list[int]]
        if isinstance(raw, str) or (raw and all(isinstance(x, str) for x in raw)):
            texts: list[str] = [raw] if isinstance(raw, str) else list(raw)  # type: ignore[arg-type]
            self._check_size(len(texts) * req.n, max(len(t) for t in texts), "prompt")
            try:
                prompts = await asyncio.to_thread(
                    lambda: [self.tok.encode(t, add_special_tokens=False) for t in texts]
                )
            except Exception as e:  # text a tokenizer refuses (a lone surrogate)
                raise APIError(
                    400, f"the prompt cannot be tokenised: {e}", param="prompt"
                ) from None
        elif raw and all(isinstance(x, int) for x in raw):
            self._check_size(req.n, 0, "prompt")
            prompts = [list(raw)]  # type: ignore[arg-type]
        elif raw and all(isinstance(x, list) for x in raw):
            self._check_size(len(raw) * req.n, 0, "prompt")
            prompts = [list(x) for x in raw]  # type: ignore[arg-type]
        else:
            raise APIError(
                400, "prompt must be a string, token ids, or a list of either", param="prompt"
            )
        if any(not p for p in prompts):
            raise APIError(400, "prompt is empty", param="prompt")
        top = req.logprobs or 0
        return prompts, [
            r for p in prompts for r in self._requests(req, p, req.max_tokens, top, ())
        ]

    async def completions_stream(self, req: CompletionRequest) -> AsyncIterator[str]:
        """The events of a ``stream=true`` completion request (checked and submitted already)."""
        prompts, requests = await self._completion_setup(req)
        return completion_events(
            self._start_stream(requests),
            model=self.name,
            detokenizers=[Detokenizer(self.tok, r.stop) for r in requests],
            final_text=lambda res: self._text(res.token_ids, res.stop_reason),
            prompt_tokens=sum(len(p) for p in prompts),
            include_usage=bool((req.stream_options or {}).get("include_usage")),
        )

    async def completions(
        self, req: CompletionRequest, disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> dict[str, Any]:
        prompts, batch = await self._completion_setup(req)
        results = await self._generate(batch, disconnected)
        choices = []
        for i, res in enumerate(results):
            prompt = prompts[i // req.n]
            entry: dict[str, Any] = {
                "index": i,
                "text": self._text(res.token_ids, res.stop_reason),
                "logprobs": self._completion_logprobs(res) if req.logprobs is not None else None,
                "finish_reason": res.finish_reason,
                "stop_reason": res.stop_reason,
            }
            if req.return_token_ids:
                entry["token_ids"] = res.token_ids
                entry["prompt_token_ids"] = prompt
            choices.append(entry)
        return self._envelope(
            "text_completion", "cmpl", choices, [t for p in prompts for t in p], results
        )

    def _completion_logprobs(self, res: GenerationResult) -> dict[str, Any]:
        tokens = [self._token(t) for t in res.token_ids]
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        tops = [
            {
                self._token(k): v
                for k, v in (res.top_logprobs[j] if j < len(res.top_logprobs) else [])
            }
            for j in range(len(tokens))
        ]
        return {
            "tokens": tokens,
            "token_logprobs": res.logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _envelope(
        self,
        kind: str,
        prefix: str,
        choices: list[dict[str, Any]],
        prompt: list[int],
        results: list[GenerationResult],
    ) -> dict[str, Any]:
        completion = sum(len(r.token_ids) for r in results)
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion,
                "total_tokens": len(prompt) + completion,
            },
            "weight_version": results[0].weight_version if results else self.engine.weight_version,
        }
