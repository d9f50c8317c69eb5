"""The built-in server's error bodies (OpenAI's ``{"error": {...}}`` shape), its JSON responses
(any text escaped) and the ASGI guards in front of every route: the API key and the body limit.

What the guards trust, and why:

* :class:`ApiKeyGuard`: with a key, every HTTP route needs ``Authorization: Bearer KEY``, the
  training routes (``/pause``, ``/resume``, ``/update_weights*``, ``/weight_version``) as much
  as the OpenAI ones: pausing the engine starves every client, pushing weights decides what the
  policy says. Only ``GET /health`` (a liveness probe) answers without it. The check is on the
  exact path, so ``//v1/...`` or ``/v1/../pause`` is refused like any other unknown caller.
* :class:`BodyLimit`: a request body larger than ``max_bytes`` is refused (413) before the
  application parses it: at once when its ``Content-Length`` says so, else as soon as that many
  bytes have streamed in; a body must arrive within ``timeout_s`` (408). ``/update_weights``
  (a whole state dict, from a key holder) is exempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse

from areal_agents.files import json_text
from areal_agents.serving.auth import bearer_matches

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_REQUEST_SEQUENCES",
    "ApiKeyGuard",
    "BodyLimit",
    "SafeJSONResponse",
    "error_response",
]

DEFAULT_MAX_REQUEST_BYTES = 32 << 20
"""The largest request body (but ``/update_weights``'s) the built-in server reads."""

DEFAULT_MAX_REQUEST_SEQUENCES = 256
"""The most sequences (prompts x ``n``) one request may ask for."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class SafeJSONResponse(JSONResponse):
    """A JSON response that any text can go into: lone surrogates (a client's ``model`` or
    ``stop`` string, echoed back) are written as ``\\uXXXX`` escapes instead of failing."""

    def render(self, content: Any) -> bytes:
        return json_text(content, allow_nan=False, separators=(",", ":")).encode()


def error_response(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """An OpenAI-shaped error body with HTTP ``status``; ``kind`` is its ``type``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return SafeJSONResponse(body, status_code=status)


async def _refuse(send: Send, status: int, message: str, kind: str) -> None:
    body = error_response(status, message, kind).body
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the rest of the request is not read
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ApiKeyGuard:
    """ASGI middleware: every route needs ``Authorization: Bearer <api_key>``, except
    ``GET``/``HEAD`` of the paths in ``open_paths`` (module docstring)."""

    def __init__(self, app: Any, api_key: str, open_paths: tuple[str, ...] = ("/health",)) -> None:
        self.app = app
        self.api_key = api_key
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        is_open = (
            kind == "http"
            and scope.get("method") in ("GET", "HEAD")
            and scope.get("path") in self.open_paths
        )
        values = [v for k, v in scope.get("headers") or [] if k.lower() == b"authorization"]
        given = values[0] if len(values) == 1 else None
        if is_open or bearer_matches(given, self.api_key):
            await self.app(scope, receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await _refuse(send, 401, "invalid or missing API key", "AuthenticationError")


class BodyLimit:
    """ASGI middleware: request bodies of at most ``max_bytes``, arrived within ``timeout_s``
    (module docstring); paths in ``exempt`` are passed through untouched."""

    def __init__(
        self,
        app: Any,
        max_bytes: int,
        timeout_s: float = 60.0,
        exempt: tuple[str, ...] = ("/update_weights",),
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") in self.exempt:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = f"the request body is over the limit of {self.max_bytes} bytes"
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(send, 413, too_big, "BadRequestError")
            return
        chunks: list[bytes] = []
        size, deadline = 0, time.monotonic() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0))
            except TimeoutError:
                await _refuse(send, 408, "the request body arrived too slowly", "BadRequestError")
                return
            if message["type"] != "http.request":  # the client left
                return
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await _refuse(send, 413, too_big, "BadRequestError")
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)
