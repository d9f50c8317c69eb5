"""The environment server's ASGI application: its routes over a :class:`SessionManager`.

:func:`create_app` is what ``python -m areal_agents.envs.serve`` runs under uvicorn (that
module's docstring lists the routes, and says what the server trusts and why). Every route
reads its body through :func:`~areal_agents.envs.server_guard.read_body` (a size limit applied
while it arrives, and a deadline), answers malformed JSON with a 4xx, and writes every reply
with :func:`~areal_agents.envs.wire.dumps`, which escapes any text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from starlette.websockets import WebSocketDisconnect

from areal_agents.envs.request_errors import RequestError
from areal_agents.envs.server_guard import ApiKeyGuard, authorised, read_body
from areal_agents.envs.sessions import SessionManager
from areal_agents.envs.wire import dumps

__all__ = ["WS_MAX_PENDING", "Pending", "create_app"]

logger = logging.getLogger(__name__)

_OPS = ("spaces", "reset", "step", "render", "close")
_JSON = "application/json"

WS_MAX_PENDING = 64
"""Requests of one WebSocket running at once; the next message is read when one finishes."""


class Pending:
    """Requests received and not yet answered (what a drain waits for)."""

    def __init__(self) -> None:
        self.count = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1


def _error(e: RequestError) -> Response:
    headers = {"Retry-After": "1"} if e.status == 503 else {}
    if e.status in (408, 413):  # the rest of the body is not worth reading
        headers["Connection"] = "close"
    return Response(dumps(e.to_dict()), status_code=e.status, media_type=_JSON, headers=headers)


def _parse(raw: bytes | str, max_bytes: int) -> dict[str, Any]:
    if len(raw) > max_bytes:
        raise RequestError(413, "TooLarge", f"request of {len(raw)} bytes (limit {max_bytes})")
    try:
        body = json.loads(raw or b"{}")
    except RecursionError:
        raise RequestError(400, "BadRequest", "the body nests too deeply") from None
    except ValueError as e:  # not JSON, not UTF-8, or an integer of more than 4300 digits
        raise RequestError(400, "BadRequest", f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "BadRequest", "the body must be a JSON object")
    return body


def _reply(value: Any) -> bytes:
    """``value`` as the wire's JSON; a value that cannot be written (nested past the
    interpreter's recursion limit) becomes a 500 answer instead of no answer."""
    try:
        return dumps(value)
    except (RecursionError, ValueError, TypeError):
        logger.exception("a reply could not be written as JSON")
        error = RequestError(500, "ServerError", "the reply could not be written as JSON")
        return dumps(
            {"id": value.get("id") if isinstance(value, dict) else None, **error.to_dict()}
        )


def create_app(
    manager: SessionManager,
    *,
    max_request_bytes: int = 64 << 20,
    request_timeout_s: float = 30.0,
    api_key: str | None = None,
    pending: Pending | None = None,
) -> FastAPI:
    """The FastAPI application serving ``manager``'s environment (see the module docstring).

    ``api_key``: every route needs ``Authorization: Bearer KEY`` (``/health`` shows only its
    status without it); None serves anyone who can connect. ``max_request_bytes`` and
    ``request_timeout_s`` bound each body while it arrives.
    """
    pending = pending or Pending()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(manager.run_reaper())
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await manager.close_all()

    app = FastAPI(
        title="areal_agents environment server",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    if api_key:
        app.add_middleware(ApiKeyGuard, api_key=api_key)
    app.state.manager = manager
    app.state.pending = pending
    ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
        op: getattr(manager, op) for op in _OPS
    }

    @app.get("/health")
    async def health(request: Request) -> Response:
        """Open to all (a load balancer's probe); the load only to key holders."""
        body = manager.health()
        if not authorised(request.headers, api_key):
            body = {"status": body["status"]}
        return Response(dumps(body), status_code=503 if manager.draining else 200, media_type=_JSON)

    def route(op: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            with pending.hold():
                try:
                    raw = await read_body(request, max_request_bytes, request_timeout_s)
                    result = await ops[op](_parse(raw, max_request_bytes))
                    return Response(dumps(result), media_type=_JSON)
                except RequestError as e:
                    return _error(e)
                except Exception:  # a bug here fails this request only
                    logger.exception("%s failed", op)
                    return _error(RequestError(500, "ServerError", f"{op} failed on the server"))

        return handle

    for op in _OPS:
        app.add_api_route(f"/{op}", route(op), methods=["POST"], name=op)

    @app.websocket("/ws")
    async def websocket(ws: WebSocket) -> None:
        """Messages of at most ``max_request_bytes`` (uvicorn closes the socket with 1009 past
        it); at most :data:`WS_MAX_PENDING` of them run at once."""
        await ws.accept()
        send = asyncio.Lock()
        running: set[asyncio.Task[None]] = set()

        async def reply(message: dict[str, Any]) -> None:
            async with send:
                with contextlib.suppress(Exception):  # the client went away: nothing to tell
                    await ws.send_text(_reply(message).decode())

        async def answer(message: dict[str, Any]) -> None:
            out: dict[str, Any] = {"id": message.get("id")}
            try:
                op = message.pop("op", None)
                if op not in ops:
                    raise RequestError(400, "BadRequest", f"'op' must be one of {list(_OPS)}")
                out.update(status=200, result=await ops[op](message))
            except RequestError as e:
                out.update(status=e.status, **e.to_dict())
            except Exception:
                logger.exception("websocket request failed")
                out.update(status=500, error={"type": "ServerError", "message": "failed"})
            await reply(out)

        async def serve_one(message: dict[str, Any]) -> None:
            with pending.hold():
                await answer(message)

        try:
            while True:
                if len(running) >= WS_MAX_PENDING:  # back-pressure: read on when one is done
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                frame = await ws.receive()
                if frame["type"] == "websocket.disconnect":
                    break
                raw = frame.get("text") or frame.get("bytes") or b""
                try:
                    message = _parse(raw, max_request_bytes)
                except RequestError as e:
                    await reply({"id": None, "status": e.status, **e.to_dict()})
                    continue
                task = asyncio.create_task(serve_one(message))
                running.add(task)
                task.add_done_callback(running.discard)
        except WebSocketDisconnect:
            pass
        except Exception:  # never drop the connection without a close frame
            logger.exception("the websocket loop failed")
            with contextlib.suppress(Exception):
                await ws.close(code=1011)
        # calls under way finish (their results stay available to a retry by request id)
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    return app
