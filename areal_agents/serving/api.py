"""The built-in server's HTTP API: OpenAI-compatible routes plus the routes training needs.

OpenAI routes speak the same fields as vLLM's OpenAI server, including its extensions for RL:
``return_token_ids`` (top-level/per-choice ``prompt_token_ids`` and per-choice ``token_ids``)
and token-id prompts on ``/v1/completions``. Every response carries the serving weight version
(``weight_version`` in the body; the ``X-Weight-Version-Start`` and ``X-Weight-Version`` headers
of :mod:`areal_agents.policies.versions`). Training routes: ``/pause``,
``/resume``, ``/weight_version``, ``/update_weights_from_disk`` (JSON ``{"path", "version"}``)
and ``/update_weights?version=N`` (a safetensors-serialised state dict as the request body; with
``&scaling=S`` the body is a LoRA adapter, merged onto the base weights: ``serving/adapters.py``).
``stream=true`` answers with server-sent events (:mod:`areal_agents.serving.streaming`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from areal_agents.errors import ConfigError, WeightSyncError
from areal_agents.policies.templates import render_prompt_ids
from areal_agents.serving.api_errors import ApiKeyGuard, error_response
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
from areal_agents.serving.version_headers import WeightVersionMiddleware

__all__ = [
    "DISCONNECT_POLL_S",
    "APIError",
    "ChatRequest",
    "CompletionRequest",
    "create_app",
    "parse_hermes_tool_calls",
]

DISCONNECT_POLL_S = 0.5
"""How often a running non-streaming request checks that its client is still there."""


class _Server:
    def __init__(self, engine: Engine, served_name: str) -> None:
        self.engine = engine
        self.name = served_name
        self.tok: Any = engine.tokenizer

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

    def _chat_setup(
        self, req: ChatRequest
    ) -> tuple[str | dict[str, Any], list[int], list[GenerationRequest]]:
        """Check a chat request; its tool choice, prompt ids and generation requests."""
        self._check_common(req)
        tools = check_tools(req.tools)
        check_messages(req.messages)
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
        try:
            prompt = render_prompt_ids(self.tok, req.messages, use_tools)
        except ConfigError as e:
            raise APIError(400, str(e), param="messages") from None
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
        choice, prompt, requests = self._chat_setup(req)
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
        choice, prompt, requests = self._chat_setup(req)
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

    def _completion_setup(
        self, req: CompletionRequest
    ) -> tuple[list[list[int]], list[GenerationRequest]]:
        """Check a completion request; its prompts and generation requests."""
        self._check_common(req)
        if req.echo:
            raise APIError(400, "echo=true is not supported by the built-in server", param="echo")
        raw = req.prompt
        prompts: list[list[int]]
        if isinstance(raw, str):
            prompts = [self.tok.encode(raw, add_special_tokens=False)]
        elif raw and all(isinstance(x, int) for x in raw):
            prompts = [list(raw)]  # type: ignore[arg-type]
        elif raw and all(isinstance(x, str) for x in raw):
            prompts = [self.tok.encode(x, add_special_tokens=False) for x in raw]
        elif raw and all(isinstance(x, list) for x in raw):
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
        prompts, requests = self._completion_setup(req)
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
        prompts, batch = self._completion_setup(req)
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


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


class _DiskUpdate(BaseModel):
    """Body of ``/update_weights_from_disk`` (module level: FastAPI must resolve the name)."""

    path: str
    version: int


def create_app(engine: Engine, served_model_name: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI application serving ``engine`` under ``served_model_name``."""
    app = FastAPI(title="areal_agents built-in inference server")
    server = _Server(engine, served_model_name)

    async def version() -> int:
        return engine.weight_version

    async def paused() -> bool:
        return engine.is_paused

    # Plain ASGI middleware (not Starlette's BaseHTTPMiddleware, under which a route never
    # sees its client disconnect): version headers as vLLM's, and the API key check.
    app.add_middleware(WeightVersionMiddleware, version=version, paused=paused)
    if api_key:
        app.add_middleware(ApiKeyGuard, api_key=api_key)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ())[1:])
        return error_response(
            400, f"{where}: {first.get('msg', 'invalid request')}", "BadRequestError", where or None
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        import torch  # loaded already by the engine

        return {
            "status": "ok",
            "weight_version": engine.weight_version,
            "torch_threads": torch.get_num_threads(),  # what OMP_NUM_THREADS etc. made of it
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "areal_agents",
            "root": engine.model_path,
            "max_model_len": engine.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(req: ChatRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        if req.stream:
            return _event_stream(await server.chat_stream(req))
        return await server.chat(req, request.is_disconnected)

    @app.post("/v1/completions", response_model=None)
    async def completions(
        req: CompletionRequest, request: Request
    ) -> dict[str, Any] | StreamingResponse:
        if req.stream:
            return _event_stream(await server.completions_stream(req))
        return await server.completions(req, request.is_disconnected)

    @app.get("/weight_version")
    async def weight_version() -> dict[str, Any]:
        return {
            "weight_version": engine.weight_version,
            "is_paused": engine.is_paused,
            **engine.stats(),  # decode_steps, seconds prefilling and decoding, prefix cache
        }

    @app.post("/pause")
    async def pause() -> dict[str, Any]:
        await asyncio.to_thread(engine.pause)
        return {"status": "paused", "weight_version": engine.weight_version}

    @app.post("/resume")
    async def resume() -> dict[str, Any]:
        engine.resume()
        return {"status": "resumed", "weight_version": engine.weight_version}

    @app.post("/update_weights_from_disk")
    async def update_from_disk(body: _DiskUpdate) -> dict[str, Any]:
        try:
            await asyncio.to_thread(engine.update_weights_from_disk, body.path, body.version)
        except WeightSyncError as e:
            raise APIError(400, str(e), "WeightSyncError") from None
        return {"status": "ok", "weight_version": engine.weight_version}

    @app.post("/update_weights")
    async def update_in_memory(
        request: Request, version: int, scaling: float | None = None
    ) -> dict[str, Any]:
        from safetensors.torch import load as load_safetensors

        data = await request.body()
        try:
            state = load_safetensors(data)
        except Exception as e:
            raise APIError(
                400, f"body is not a safetensors state dict: {e}", "WeightSyncError"
            ) from None
        try:
            if scaling is None:
                await asyncio.to_thread(engine.update_weights, state, version)
            else:  # a LoRA adapter merged onto the kept base (serving/adapters.py)
                await asyncio.to_thread(engine.update_adapter, state, scaling, version)
        except WeightSyncError as e:
            raise APIError(400, str(e), "WeightSyncError") from None
        return {"status": "ok", "weight_version": engine.weight_version}

    return app
