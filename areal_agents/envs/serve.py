"""``python -m areal_agents.envs.serve env=ID``: a Gymnasium environment over HTTP and WebSocket.

Any registered environment can be served: a built-in alias (``calculator``), an id
(``areal_agents/Search-v0``) or a user's ``module:Env-v0``. Extra ``KEY=VALUE`` arguments are
keyword arguments of every ``gym.make`` (values parsed as YAML: ``max_turns=4``); clients may add
only the keys ``--client-kwargs`` allows. The server binds 127.0.0.1 unless told otherwise and
prints its URL when it is ready::

    AREAL_ENV_API_KEY=... python -m areal_agents.envs.serve env=calculator --port 8100
    AREAL_ENV_API_KEY=... python -m areal_agents.train env=remote:http://127.0.0.1:8100/calculator

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

What the server trusts, and why
-------------------------------
The environments it serves run tools and graders on this host, so a client is trusted with
nothing that runs here:

* **No code from clients.** A client's task (``reset(options={"task": {...}})``) may say what
  the model is asked and what the answer is, but a task that carries code the graders execute
  (unit ``tests``, their ``preamble``, a dataset scorer's ``entry``:
  :data:`~areal_agents.envs.sessions.CODE_TASK_KEYS`) is refused with ``403 TaskNotAllowed``
  unless the server was started with ``--trust-client-tasks`` (every client is then as trusted
  as the server's own user). Clients set only the ``gym.make`` arguments ``--client-kwargs``
  allows (by default none that reach files or weaken a sandbox).
* **Only key holders.** With ``--api-key`` or ``AREAL_ENV_API_KEY`` (preferred: a command line
  is readable by every local user), every route and the WebSocket need
  ``Authorization: Bearer KEY``; ``/health`` answers its status only. Without a key, anyone who
  can reach the port is a client: keep the default 127.0.0.1 bind on a shared machine only with
  a key.
* **Bounded resources.** Bodies and WebSocket messages are limited while they arrive
  (``--max-request-mb``); a request head or body that trickles is cut off after
  ``--request-timeout-s``; idle keep-alive connections close after ``--keep-alive-s``
  (:mod:`areal_agents.envs.server_guard`). Sessions are bounded (``--max-sessions``): when they
  are all open, the longest-idle one not in a call is closed to make room, so that idle sessions
  cannot lock other clients out (``--evict-idle-s`` spares those used more recently). A
  WebSocket has at most :data:`WS_MAX_PENDING` requests running; it reads its next message when
  one finishes.
* **Errors are answers.** Malformed, deeply nested or oversized JSON, huge integers and unknown
  fields are 4xx answers; a request id reused for a different request is ``409``; a reply holding
  any text (lone surrogates too) is sent escaped (:func:`~areal_agents.envs.wire.dumps`).

On SIGTERM or SIGINT the server drains: new requests get ``503 ServerDraining`` while the
environment calls under way finish and are answered (up to ``--drain-timeout-s``), then every
session is closed and the process exits. A second signal stops at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import Any, Self

import uvicorn
import yaml

from areal_agents.envs.server_app import WS_MAX_PENDING, Pending, create_app
from areal_agents.envs.server_guard import timed_h11
from areal_agents.envs.sessions import DEFAULT_CLIENT_KWARGS, SessionManager
from areal_agents.envs.wire import API_KEY_ENV, resolve_api_key
from areal_agents.errors import ConfigError

__all__ = ["WS_MAX_PENDING", "EnvServer", "create_app", "main"]

logger = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn, with a drain on the first SIGTERM/SIGINT and the URL printed when ready."""

    def __init__(
        self,
        config: uvicorn.Config,
        manager: SessionManager,
        pending: Pending,
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
    request_timeout_s: float,
    keep_alive_s: float,
    api_key: str | None,
    log_level: str,
    announce: bool,
) -> _Server:
    if request_timeout_s <= 0 or keep_alive_s <= 0 or max_request_bytes < 1:
        raise ConfigError(
            f"request_timeout_s={request_timeout_s}, keep_alive_s={keep_alive_s} and "
            f"max_request_bytes={max_request_bytes} must be positive"
        )
    pending = Pending()
    app = create_app(
        manager,
        max_request_bytes=max_request_bytes,
        request_timeout_s=request_timeout_s,
        api_key=api_key,
        pending=pending,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=timed_h11(request_timeout_s),  # request heads have a deadline
        ws_max_size=max_request_bytes,  # checked while a message arrives
        timeout_graceful_shutdown=5,
        timeout_keep_alive=max(1, round(keep_alive_s)),
        lifespan="on",
    )
    return _Server(config, manager, pending, drain_timeout_s, announce)


class EnvServer:
    """The environment server in a background thread of this process (tests, notebooks).

    >>> with EnvServer("calculator") as server:  # doctest: +SKIP
    ...     env = RemoteEnv(server.url, "calculator")

    ``url`` is ``http://127.0.0.1:PORT`` once :meth:`start` returns (``port=0``: a free one).
    ``api_key`` (None: :data:`~areal_agents.envs.server_guard.API_KEY_ENV`, if set),
    ``max_request_bytes``, ``request_timeout_s`` and ``keep_alive_s`` are the command line's
    guards; other keyword arguments go to :class:`~areal_agents.envs.sessions.SessionManager`
    (``trust_client_tasks``, ``evict_idle_s``, ...).
    """

    def __init__(
        self,
        env: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        drain_timeout_s: float = 30.0,
        max_request_bytes: int = 64 << 20,
        request_timeout_s: float = 30.0,
        keep_alive_s: float = 60.0,
        api_key: str | None = None,
        **manager_kwargs: Any,
    ) -> None:
        self.manager = SessionManager(env, **manager_kwargs)
        self._server = _build(
            self.manager,
            host,
            port,
            drain_timeout_s=drain_timeout_s,
            max_request_bytes=max_request_bytes,
            request_timeout_s=request_timeout_s,
            keep_alive_s=keep_alive_s,
            api_key=resolve_api_key(api_key),
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
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=30.0,
        help="a request's head, then its body, must arrive within this (30)",
    )
    parser.add_argument(
        "--keep-alive-s", type=float, default=60.0, help="close idle connections after (60)"
    )
    parser.add_argument(
        "--evict-idle-s",
        type=float,
        default=0.0,
        help="when every session is open, close the longest-idle one unused this long "
        "(0: any not in a call; more lets clients that hold every session lock others out)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require this bearer token on every route (better: set {API_KEY_ENV}, which "
        "other local users cannot read from the process list)",
    )
    parser.add_argument(
        "--trust-client-tasks",
        action="store_true",
        help="accept tasks from clients that carry code the graders run (unit tests, "
        "preambles): any client can then run code as this server's user",
    )
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
            evict_idle_s=ns.evict_idle_s,
            trust_client_tasks=ns.trust_client_tasks,
            threads=ns.threads,
        )
        server = _build(
            manager,
            ns.host,
            ns.port,
            drain_timeout_s=ns.drain_timeout_s,
            max_request_bytes=int(ns.max_request_mb * (1 << 20)),
            request_timeout_s=ns.request_timeout_s,
            keep_alive_s=ns.keep_alive_s,
            api_key=resolve_api_key(ns.api_key),
            log_level=ns.log_level,
            announce=True,
        )
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")
    server.run()
    if not server.started:
        sys.exit(1)


if __name__ == "__main__":
    main()
