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

What it trusts, and why
-----------------------
A request's text is the policy's input, never code, and its size is the client's choice, so
every request is checked for what it would cost **before** it is tokenised or queued, with an
OpenAI-shaped 400:

* the body is at most ``max_request_bytes`` (checked while it streams in: :class:`~areal_agents.
  serving.api_errors.BodyLimit`);
* a request asks for at most ``max_request_sequences`` sequences (prompts x ``n``), so one
  request cannot queue a hundred thousand generations ahead of everyone;
* a prompt's characters are counted first: a text longer than ``max_model_len`` times the longest
  token (in characters) of the vocabulary cannot fit the context, and is refused without being
  tokenised (a 100 MB prompt is refused in microseconds); the rest is tokenised in a worker
  thread, off the event loop;
* malformed fields (content parts that are not text, a seed outside int64, a chat that the
  template cannot render) are 400s, and any text echoed back is escaped
  (:class:`~areal_agents.serving.api_errors.SafeJSONResponse`).

With an API key, every route but ``GET /health`` needs it, the training routes included
(:class:`~areal_agents.serving.api_errors.ApiKeyGuard`): ``/pause`` starves every client and
``/update_weights*`` decides what the policy says. Without a key, anyone who can reach the port
can do both: keep the default 127.0.0.1 bind, and use a key on a shared machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from areal_agents.errors import ConfigError, WeightSyncError
from areal_agents.serving.api_errors import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_REQUEST_SEQUENCES,
    ApiKeyGuard,
    BodyLimit,
    SafeJSONResponse,
    error_response,
)
from areal_agents.serving.engine import Engine
from areal_agents.serving.generation import DISCONNECT_POLL_S, OpenAIHandler
from areal_agents.serving.schema import (
    APIError,
    ChatRequest,
    CompletionRequest,
    parse_hermes_tool_calls,
)
from areal_agents.serving.version_headers import WeightVersionMiddleware

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_REQUEST_SEQUENCES",
    "DISCONNECT_POLL_S",
    "APIError",
    "ChatRequest",
    "CompletionRequest",
    "create_app",
    "parse_hermes_tool_calls",
]


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


class _DiskUpdate(BaseModel):
    """Body of ``/update_weights_from_disk`` (module level: FastAPI must resolve the name)."""

    path: str
    version: int


def create_app(
    engine: Engine,
    served_model_name: str,
    api_key: str | None = None,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_request_sequences: int = DEFAULT_MAX_REQUEST_SEQUENCES,
) -> FastAPI:
    """The FastAPI application serving ``engine`` under ``served_model_name``.

    ``api_key``: every route but ``GET /health`` needs ``Authorization: Bearer KEY``; None
    serves anyone who can connect. ``max_request_bytes`` and ``max_request_sequences`` bound
    what one request may cost (see the module docstring).
    """
    if max_request_bytes < 1 or max_request_sequences < 1:
        raise ConfigError(
            f"max_request_bytes={max_request_bytes} and max_request_sequences="
            f"{max_request_sequences} must be positive"
        )
    app = FastAPI(
        title="areal_agents built-in inference server", default_response_class=SafeJSONResponse
    )
    server = OpenAIHandler(engine, served_model_name, max_request_sequences)

    async def version() -> int:
        return engine.weight_version

    async def paused() -> bool:
        return engine.is_paused

    # Plain ASGI middleware (not Starlette's BaseHTTPMiddleware, under which a route never
    # sees its client disconnect): version headers as vLLM's, and the API key check.
    app.add_middleware(WeightVersionMiddleware, version=version, paused=paused)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    if api_key:  # outermost: nobody without the key gets a body read
        app.add_middleware(ApiKeyGuard, api_key=api_key)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "BadRequestError" if exc.status_code < 500 else "InternalServerError"
        return error_response(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        return error_response(400, "the request nests too deeply", "BadRequestError")

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
