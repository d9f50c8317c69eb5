"""What the environment server checks before a request reaches a session: who may call it, how
big a request may be, and how long a client may take to send it.

The environment server (:mod:`areal_agents.envs.serve`) runs environments whose tools and
graders execute on its host; these guards keep a client it does not trust from reaching them or
from exhausting it:

* **The API key** (:class:`ApiKeyGuard`). With a key (``--api-key``, or the environment variable
  :data:`API_KEY_ENV`, which keeps it off the command line where every local user can read it),
  every HTTP route and the WebSocket need ``Authorization: Bearer <key>``; ``GET /health``
  answers without it, but only its status. Keys are compared in constant time.
* **Bodies** (:func:`read_body`). A declared ``Content-Length`` over the limit is refused before
  a byte is read; a body that streams (chunked, or longer than declared) is counted while it
  arrives and refused at the limit, so memory never holds more than the limit. A body must
  arrive within the request timeout (a client trickling it a byte at a time is cut off). The
  refusal closes the connection, so the rest is never read.
* **Request heads** (:func:`timed_h11`). A connection must send a complete request head within
  the request timeout of connecting or of starting a request, and a connection whose request
  was answered before its body was read is closed: half-open or trickling connections cannot
  pile up. Idle keep-alive connections close after the keep-alive time (uvicorn's own timer).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import h11
from starlette.requests import Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from areal_agents.envs.request_errors import RequestError
from areal_agents.envs.wire import API_KEY_ENV

__all__ = ["ApiKeyGuard", "authorised", "read_body", "timed_h11"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def authorised(headers: Any, api_key: str | None) -> bool:
    """Whether the ``headers`` (ASGI pairs or a Starlette ``Headers``) carry the bearer key;
    always true without a key."""
    if api_key is None:
        return True
    if isinstance(headers, list | tuple):
        values = [v for k, v in headers if k.lower() == b"authorization"]
        given = values[0] if len(values) == 1 else b""
    else:
        given = str(headers.get("authorization", "")).encode("latin-1", "replace")
    return hmac.compare_digest(given, f"Bearer {api_key}".encode())


class ApiKeyGuard:
    """ASGI middleware: every HTTP request and WebSocket needs the bearer key, except the paths
    in ``open_paths`` (the route itself decides what an unauthorised caller sees there).

    An unauthorised HTTP request gets ``401`` (``{"error": {"type": "Unauthorized"}}``) and
    its body is never read; an unauthorised WebSocket is refused before it is accepted (HTTP
    403 to the handshake).
    """

    def __init__(self, app: Any, api_key: str, open_paths: tuple[str, ...] = ("/health",)) -> None:
        self.app = app
        self.api_key = api_key
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        headers = scope.get("headers") or []
        is_open = (
            kind == "http"
            and scope.get("method") in ("GET", "HEAD")
            and scope.get("path") in self.open_paths
        )
        if kind not in ("http", "websocket") or is_open or authorised(headers, self.api_key):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "missing API key"})
            return
        body = (
            b'{"error":{"type":"Unauthorized","message":"this server needs its API key: send '
            b"Authorization: Bearer KEY (RemoteEnv reads it from " + API_KEY_ENV.encode() + b')"}}'
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request's body, refused (:class:`RequestError` 413) as soon as it passes ``limit``
    bytes (declared or streamed) and (408) when it has not all arrived within ``timeout_s``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(400, "BadRequest", "Content-Length is not a number") from None
        if size > limit:
            raise RequestError(413, "TooLarge", f"request of {size} bytes (limit {limit})")
    chunks: list[bytes] = []
    received = 0
    deadline = time.monotonic() + timeout_s
    stream = request.stream().__aiter__()
    while True:
        left = deadline - time.monotonic()
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(left, 0.0))
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise RequestError(
                408, "RequestTimeout", f"the body did not arrive within {timeout_s:g} s"
            ) from None
        received += len(chunk)
        if received > limit:
            raise RequestError(413, "TooLarge", f"request of more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def timed_h11(head_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, with a deadline on request heads (see the module docstring).

    A connection whose next request head has not fully arrived ``head_timeout_s`` after it
    connected, or after the first byte of that head, is closed; so is one whose response went
    out before its request body was read (a refused body: reading on would only feed it).
    """

    class TimedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self.conn.their_state is h11.IDLE:
                self._arm()  # the first bytes of a new request on a kept-alive connection
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the head is in (or the end came)
                self._disarm()

        def on_response_complete(self) -> None:
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.transport.close()  # answered before its body was read: read no more
                return
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(head_timeout_s, self._late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _late(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol
