"""``python -m areal_agents.envs.serve env=ID``: a Gymnasium environment over HTTP and WebSocket.

Any registered environment can be served: a built-in alias (``calculator``), an id
(``areal_agents/Search-v0``) or a user's ``module:Env-v0``. Extra ``KEY=VALUE`` arguments are
keyword arguments of every ``gym.make`` (values parsed as YAML: ``max_turns=4``); clients may add
only the keys ``--client-kwargs`` allows. The server binds 127.0.0.1 unless told otherwise and
prints its URL when it is ready::

    python -m areal_agents.envs.serve env=calculator --port 8100
    python -m areal_agents.train env=remote:http://127.0.0.1:8100/calculator ...

Routes (JSON bodies; errors are ``{"error": {"type", "message"}}`` with a 4xx/5xx status):

=================  =============================================================================
``GET /health``    status (``ok``, or ``draining`` with 503), the environment, sessions, load
``POST /spaces``   ``{kwargs}`` -> observation and action spaces, metadata (no session opened)
``POST /reset``    ``{session_id?, seed?, options?, kwargs?, request_id?}`` -> ``{session_id,
                   observation, info}``; without ``session_id`` a new session is opened
``POST /step``     ``{session_id, action, action_kind?, request_id?}`` -> ``{observation,
                   reward, terminated, truncated, info, assistant?}``
``POST /render``   ``{session_id}`` -> ``{render}``
``POST /close``    ``{session_id}`` -> ``{closed}``
``WS /ws``         the same operations as messages ``{"op": "step", "id": N, ...}``, answered by
                   ``{"id": N, "status": 200, "result": ...}`` (or ``"error"``), in any order
=================  =============================================================================

On SIGTERM or SIGINT the server drains: new requests get ``503 ServerDraining`` while the
environment calls under way finish and are answered (up to ``--drain-timeout-s``), then every
session is closed and the process exits. A second signal stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any, Self

import uvicorn
import yaml
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from starlette.websockets import WebSocketDisconnect

from areal_agents.envs.request_errors import RequestError
from areal_agents.envs.sessions import DEFAULT_CLIENT_KWARGS, SessionManager
from areal_agents.envs.wire import dumps
from areal_agents.errors import ConfigError

__all__ = ["EnvServer", "create_app", "main"]

logger = logging.getLogger(__name__)

_OPS = ("spaces", "reset", "step", "render", "close")
_JSON = "application/json"


class _Pending:
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
    headers = {"Retry-After": "1"} if e.status == 503 else None
    return Response(dumps(e.to_dict()), status_code=e.status, media_type=_JSON, headers=headers)


def _parse(raw: bytes | str, max_bytes: int) -> dict[str, Any]:
    if len(raw) > max_bytes:
        raise RequestError(413, "TooLarge", f"request of {len(raw)} bytes (limit {max_bytes})")
    try:
        body = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, "BadRequest", f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "BadRequest", "the body must be a JSON object")
    return body


def create_app(
    manager: SessionManager, *, max_request_bytes: int = 64 << 20, pending: _Pending | None = None
) -> FastAPI:
    """The FastAPI application serving ``manager``'s environment (see the module docstring)."""
    pending = pending or _Pending()

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
    app.state.manager = manager
    app.state.pending = pending
    ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
        op: getattr(manager, op) for op in _OPS
    }

    @app.get("/health")
    async def health() -> Response:
        body = manager.health()
        return Response(dumps(body), status_code=503 if manager.draining else 200, media_type=_JSON)

    def route(op: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            with pending.hold():
                try:
                    result = await ops[op](_parse(await request.body(), max_request_bytes))
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
        await ws.accept()
        send = asyncio.Lock()
        running: set[asyncio.Task[None]] = set()

        async def answer(message: dict[str, Any]) -> None:
            reply: dict[str, Any] = {"id": message.get("id")}
            try:
                op = message.pop("op", None)
                if op not in ops:
                    raise RequestError(400, "BadRequest", f"'op' must be one of {list(_OPS)}")
                reply.update(status=200, result=await ops[op](message))
            except RequestError as e:
                reply.update(status=e.status, **e.to_dict())
            except Exception:
                logger.exception("websocket request failed")
                reply.update(status=500, error={"type": "ServerError", "message": "failed"})
            async with send:
                with contextlib.suppress(Exception):  # the client went away: nothing to tell
                    await ws.send_text(dumps(reply).decode())

        async def serve_one(message: dict[str, Any]) -> None:
            with pending.hold():
                await answer(message)

        try:
            while True:
                frame = await ws.receive()
                if frame["type"] == "websocket.disconnect":
                    break
                raw = frame.get("text") or frame.get("bytes") or b""
                try:
                    message = _parse(raw, max_request_bytes)
                except RequestError as e:
                    async with send:
                        await ws.send_text(
                            dumps({"id": None, "status": e.status, **e.to_dict()}).decode()
                        )
                    continue
                task = asyncio.create_task(serve_one(message))
                running.add(task)
                task.add_done_callback(running.discard)
        except WebSocketDisconnect:
            pass
        # calls under way finish (their results stay available to a retry by request id)
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    return app


class _Server(uvicorn.Server):
    """uvicorn, with a drain on the first SIGTERM/SIGINT and the URL printed when ready."""

    def __init__(
        self,
        config: uvicorn.Config,
        manager: SessionManager,
        pending: _Pending,
        drain_timeout_s: float,
        announce: bool,
    ) -> None:
        super().__init__(config)
        self.manager = manager
        self.pending = pending
        self.drain_timeout_s = drain_timeout_s
        self.announce = announce
        self.drain_deadline: float | None = None
        self.port: int | None = None
        self.ready = threading.Event()

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        if self.servers and self.servers[0].sockets:
            self.port = int(self.servers[0].sockets[0].getsockname()[1])
        self.ready.set()
        if self.announce and self.port is not None:
            url = f"http://{self.config.host}:{self.port}"
            print(
                f"serving {self.manager.env_name} at {url} "
                f"(train or eval with env=remote:{url}/{self.manager.env_name})",
                flush=True,
            )

    def drain(self) -> None:
        """Stop taking work; exit once what runs is answered (or the drain timeout passes)."""
        if self.drain_deadline is None:
            self.manager.start_draining()
            self.drain_deadline = time.monotonic() + self.drain_timeout_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_deadline is None:
            logger.warning("signal %d: draining %d request(s)", sig, self.pending.count)
            self.drain()
        else:  # a second signal: stop now
            super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and (
            self.pending.count == 0 or time.monotonic() >= self.drain_deadline
        ):
            if self.pending.count:
                logger.error("drain timeout: %d request(s) still running", self.pending.count)
            self.should_exit = True
        return await super().on_tick(counter)


def _build(
    manager: SessionManager,
    host: str,
    port: int,
    *,
    drain_timeout_s: float,
    max_request_bytes: int,
    log_level: str,
    announce: bool,
) -> _Server:
    pending = _Pending()
    app = create_app(manager, max_request_bytes=max_request_bytes, pending=pending)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        ws_max_size=max_request_bytes,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(max(5, manager.idle_timeout_s)),  # clients keep a connection
        lifespan="on",
    )
    return _Server(config, manager, pending, drain_timeout_s, announce)


class EnvServer:
    """The environment server in a background thread of this process (tests, notebooks).

    >>> with EnvServer("calculator") as server:  # doctest: +SKIP
    ...     env = RemoteEnv(server.url, "calculator")

    ``url`` is ``http://127.0.0.1:PORT`` once :meth:`start` returns (``port=0``: a free one).
    Keyword arguments go to :class:`~areal_agents.envs.sessions.SessionManager`.
    """

    def __init__(
        self,
        env: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        drain_timeout_s: float = 30.0,
        max_request_bytes: int = 64 << 20,
        **manager_kwargs: Any,
    ) -> None:
        self.manager = SessionManager(env, **manager_kwargs)
        self._server = _build(
            self.manager,
            host,
            port,
            drain_timeout_s=drain_timeout_s,
            max_request_bytes=max_request_bytes,
            log_level="warning",
            announce=False,
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self._server.config.host}:{self._server.port}"

    def start(self, timeout: float = 30.0) -> Self:
        """Serve in a daemon thread; return once it listens."""
        self._thread = threading.Thread(
            target=self._server.run, name="areal-env-server", daemon=True
        )
        self._thread.start()
        if not self._server.ready.wait(timeout) or self._server.port is None:
            raise RuntimeError(f"the environment server did not start within {timeout} s")
        return self

    def drain(self) -> None:
        """What SIGTERM does: refuse new work, answer what runs, then stop."""
        self._server.drain()

    def stop(self, timeout: float = 30.0) -> None:
        """Drain and wait for the server thread to end."""
        self.drain()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _env_kwargs(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{pair!r}: environment arguments are KEY=VALUE (e.g. max_turns=4)")
        out[key] = yaml.safe_load(value) if value else ""
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m areal_agents.envs.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "args",
        nargs="+",
        metavar="env=ID|KEY=VALUE",
        help="the environment (alias, id or module:Env-v0) and its keyword arguments",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8100, help="8100; 0: any free port")
    parser.add_argument("--max-sessions", type=int, default=256, help="open at once (256)")
    parser.add_argument(
        "--idle-timeout-s", type=float, default=600.0, help="close sessions idle this long (600)"
    )
    parser.add_argument(
        "--drain-timeout-s", type=float, default=30.0, help="longest drain on SIGTERM (30)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="environment threads (max sessions, <= 512)"
    )
    parser.add_argument(
        "--client-kwargs",
        default=",".join(DEFAULT_CLIENT_KWARGS),
        help="comma-separated keyword arguments clients may set ('*': any; '': none)",
    )
    parser.add_argument("--max-request-mb", type=float, default=64.0, help="largest body (64)")
    parser.add_argument("--log-level", default="warning")
    ns = parser.parse_args(argv)
    env = [a for a in ns.args if a.startswith("env=")]
    if len(env) != 1 or not env[0][4:]:
        parser.error("name the environment once: env=ID (an alias, an id or module:Env-v0)")
    logging.basicConfig(level=ns.log_level.upper())
    try:
        manager = SessionManager(
            env[0][4:],
            env_kwargs=_env_kwargs([a for a in ns.args if not a.startswith("env=")]),
            client_kwargs=[k.strip() for k in ns.client_kwargs.split(",") if k.strip()],
            max_sessions=ns.max_sessions,
            idle_timeout_s=ns.idle_timeout_s,
            threads=ns.threads,
        )
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")
    server = _build(
        manager,
        ns.host,
        ns.port,
        drain_timeout_s=ns.drain_timeout_s,
        max_request_bytes=int(ns.max_request_mb * (1 << 20)),
        log_level=ns.log_level,
        announce=True,
    )
    server.run()
    if not server.started:
        sys.exit(1)


if __name__ == "__main__":
    main()
