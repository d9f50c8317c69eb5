"""vLLM's responses carry the weight version they were generated under (ASGI middleware).

:class:`WeightVersionMiddleware` adds the headers of :mod:`areal_agents.policies.versions` to
every HTTP response of stock vLLM's OpenAI server (the launcher passes it with vLLM's
``--middleware`` flag): ``X-Weight-Version-Start`` (the version when the request arrived) and
``X-Weight-Version`` (when the response began: for a non-streaming request, after the generation
ended). It reads the version from vLLM's engine, which ``/finish_weight_update`` and
``/update_weight_version`` set. The module imports nothing beyond the standard library, and
nothing of areal_agents: the launcher copies it as a standalone module onto vLLM's path, so
that it loads in vLLM's own interpreter.

:class:`ApiKeyMiddleware` (also passed with ``--middleware``) puts vLLM's API key in front of
every route. vLLM's own check (``--api-key``/``VLLM_API_KEY``) covers only ``/v1/``, while the
launcher turns on vLLM's dev-mode routes (``/pause``, ``/collective_rpc``,
``/update_weights``...) that pause the engine, run methods on its workers and replace the
weights: with a key, those need it too. Only ``GET /health`` stays open (the launcher's probe).
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = [
    "API_KEY_ENV",
    "END_HEADER",
    "GENERATION_PATHS",
    "PAUSE_PATH",
    "START_HEADER",
    "ApiKeyMiddleware",
    "WeightVersionMiddleware",
]

#: vLLM's own variable for its API key; :class:`ApiKeyMiddleware` reads the same one.
API_KEY_ENV = "VLLM_API_KEY"
#: Paths answered without the key (``GET``/``HEAD`` only): the liveness probe.
OPEN_PATHS = ("/health",)

# the same names as areal_agents.policies.versions (not imported: this module stands alone)
START_HEADER = "X-Weight-Version-Start"
END_HEADER = "X-Weight-Version"
#: The OpenAI routes that generate tokens: only these wait out a pause. Every other route (the
#: LoRA adapter loads a push makes while the engine is paused, above all) passes at once.
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
#: vLLM's pause route. vLLM sends the aborted requests' last outputs *before* it marks itself
#: paused, so a client that continues an aborted generation at once can get in ahead of the
#: pause flag; the middleware holds generation from the moment this request arrives instead.
PAUSE_PATH = "/pause"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _parse(value: object) -> str:
    """The version as digits ("default", vLLM's before any update: "0"); "" if unreadable."""
    text = str(value).strip()
    if text.isdigit():
        return str(int(text))
    return "0" if text == "default" else ""


class WeightVersionMiddleware:
    """ASGI middleware for vLLM's OpenAI server: version headers on every HTTP response.

    A generation request (``POST`` to one of :data:`GENERATION_PATHS`) that arrives while the
    engine is paused for a weight update waits here until it resumes (vLLM would hold it
    anyway), so its start version is the one that generates it, not the one being replaced.
    "Paused" starts when a ``POST`` to :data:`PAUSE_PATH` arrives, not when vLLM reports it:
    vLLM answers the requests it aborts before it sets its flag.

    Args:
        app: the wrapped ASGI application.
        version: an async function returning the served version (default: vLLM's
            ``app.state.engine_client.get_weight_version()``).
        paused: an async function, true while generation is paused (default: vLLM's
            ``engine_client.is_paused()``).
        poll_s: how often a held request checks for the resume.
    """

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        version: Callable[[], Awaitable[Any]] | None = None,
        paused: Callable[[], Awaitable[bool]] | None = None,
        poll_s: float = 0.01,
    ) -> None:
        self.app = app
        self._version = version
        self._paused = paused
        self.poll_s = poll_s
        self._pausing = 0  # /pause requests being handled now

    async def _current(self, scope: Scope) -> str:
        try:
            if self._version is not None:
                value = await self._version()
            else:
                value = await scope["app"].state.engine_client.get_weight_version()
        except Exception:  # never fail a request over its label; the client sees no header
            return ""
        return _parse(value)

    async def _wait_resumed(self, scope: Scope) -> None:
        try:
            while self._pausing or await (
                self._paused()
                if self._paused is not None
                else scope["app"].state.engine_client.is_paused()
            ):
                await asyncio.sleep(self.poll_s)
        except Exception:  # no pause state to read: vLLM holds the request itself
            return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("method") == "POST" and scope.get("path") == PAUSE_PATH:
            self._pausing += 1  # until vLLM's own flag is set (it is when /pause returns)
            try:
                await self._with_versions(scope, receive, send)
            finally:
                self._pausing -= 1
            return
        if scope.get("method") == "POST" and scope.get("path") in GENERATION_PATHS:
            await self._wait_resumed(scope)
        await self._with_versions(scope, receive, send)

    async def _with_versions(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = await self._current(scope)
        names = (START_HEADER.lower().encode(), END_HEADER.lower().encode())

        async def send_with_version(message: Message) -> None:
            if message.get("type") == "http.response.start":
                end = await self._current(scope)
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                if start:
                    headers.append((names[0], start.encode()))
                if end:
                    headers.append((names[1], end.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_version)


class ApiKeyMiddleware:
    """ASGI middleware for vLLM's OpenAI server: every route needs ``Authorization: Bearer
    KEY`` (``KEY`` from :data:`API_KEY_ENV`, or ``api_key``), but ``GET /health``; no key, no
    check. Unauthorised requests get 401 before vLLM sees them (WebSockets: refused)."""

    def __init__(self, app: Callable[..., Awaitable[None]], api_key: str | None = None) -> None:
        self.app = app
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if self.expected is None or kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope.get("headers") or [] if k.lower() == b"authorization"]
        given = values[0] if len(values) == 1 else b""
        is_open = (
            kind == "http"
            and scope.get("method") in ("GET", "HEAD")
            and scope.get("path") in OPEN_PATHS
        )
        if is_open or hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b'{"error":{"message":"invalid or missing API key","type":"AuthenticationError"}}'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
