"""A strict, independent fake of the OpenAI chat completions API, for tests.

What it is: a small FastAPI app that validates each request against the OpenAI spec's request
schema (unknown fields, wrong types, bad roles, tool messages that answer no tool call, a
missing bearer key: all rejected as the real API would, with a 400/401 in OpenAI's error
format) and answers with responses a Python ``script`` writes. What it is not: a model. It
shares no code with areal_agents' server, so a client that passes against it speaks the spec,
not just this package's dialect. ``failures`` makes the next N requests fail with a status.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from areal_agents.net import free_port

Script = Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Function(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _Tool(_Strict):
    type: Literal["function"]
    function: _Function


class _CallFunction(_Strict):
    name: str
    arguments: str  # the spec: a JSON string, never an object


class _ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"]
    function: _CallFunction


class _Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None


class _NamedChoice(_Strict):
    type: Literal["function"]
    function: dict[str, str]


class ChatRequest(_Strict):
    model: str
    messages: list[_Message] = Field(min_length=1)
    tools: list[_Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | _NamedChoice | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    stream: bool | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None


def _semantic_errors(req: ChatRequest) -> str | None:
    pending: set[str] = set()
    for i, m in enumerate(req.messages):
        if m.role == "tool":
            if m.tool_call_id not in pending:
                return (
                    f"messages[{i}]: tool message answers no pending tool call {m.tool_call_id!r}"
                )
            pending.discard(m.tool_call_id)
            if not isinstance(m.content, str):
                return f"messages[{i}]: tool content must be a string"
            continue
        if pending:
            return f"messages[{i}]: tool calls {sorted(pending)} were not answered"
        if m.role in ("system", "developer", "user") and m.content is None:
            return f"messages[{i}]: content is required for role {m.role}"
        if m.tool_call_id is not None:
            return f"messages[{i}]: tool_call_id is only allowed on tool messages"
        if m.tool_calls:
            if m.role != "assistant":
                return f"messages[{i}]: only assistant messages carry tool_calls"
            pending = {c.id for c in m.tool_calls}
    if req.tool_choice not in (None, "none") and not req.tools:
        return "tool_choice is set but no tools were given"
    if req.stream:
        return "this fake does not stream"
    return None


class FakeOpenAI:
    """The fake server: ``with FakeOpenAI(script).running() as fake: fake.base_url``."""

    def __init__(
        self, script: Script, *, api_key: str = "test-key", model: str = "scripted"
    ) -> None:
        self.script = script
        self.api_key = api_key
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.failures: list[int] = []  # statuses for the next requests, consumed in order
        self.delay_s = 0.0  # how long each answer takes
        self.in_flight = 0
        self.max_in_flight = 0
        self.app = self._build()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _build(self) -> FastAPI:
        app = FastAPI()

        def error(status: int, message: str, kind: str) -> JSONResponse:
            body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
            return JSONResponse(body, status_code=status)

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
            return error(400, f"invalid request: {exc.errors()[:3]}", "invalid_request_error")

        @app.post("/v1/chat/completions", response_model=None)
        async def chat(body: ChatRequest, request: Request) -> dict[str, Any] | JSONResponse:
            if request.headers.get("authorization") != f"Bearer {self.api_key}":
                return error(401, "Incorrect API key provided", "invalid_request_error")
            if self.failures:
                status = self.failures.pop(0)
                return error(status, f"injected failure {status}", "server_error")
            problem = _semantic_errors(body)
            if problem:
                return error(400, problem, "invalid_request_error")
            if body.model != self.model:
                return error(
                    404, f"The model `{body.model}` does not exist", "invalid_request_error"
                )
            data = body.model_dump(exclude_none=True)
            self.requests.append(data)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.delay_s)
            finally:
                self.in_flight -= 1
            message = self.script(data["messages"], data.get("tools", []))
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            return {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", **message},
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            }

        return app

    @contextmanager
    def running(self) -> Iterator[FakeOpenAI]:
        self.port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.02)
        try:
            yield self
        finally:
            server.should_exit = True
            thread.join(timeout=10)
