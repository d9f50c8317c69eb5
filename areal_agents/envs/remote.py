"""A Gymnasium environment served by another process: ``RemoteEnv(url, env_id)``.

:class:`RemoteEnv` is itself a :class:`gymnasium.Env` whose spaces, metadata, observations and
infos come from an environment server (``python -m areal_agents.envs.serve``), so anything that
takes an environment takes a remote one. The command lines name it
``env=remote:http://HOST:PORT/ENV_ID`` (``remote:ws://...`` for the WebSocket transport, which
costs less per step); :func:`register_remote` turns such a name into a registered Gymnasium id.
Connection options ride in the query string: ``remote:http://h:8100/calculator?timeout_s=60``.

Keyword arguments other than ``connection`` and ``api_key`` are the environment's own
(``max_turns=4``): the server passes them to ``gym.make`` if it allows them.

A server started with an API key wants it on every request: :class:`RemoteEnv` sends
``Authorization: Bearer KEY`` with ``api_key``, else the environment variable
``AREAL_ENV_API_KEY`` (never in the URL, which ends up in configs and logs). A refused key is a
:class:`~areal_agents.errors.ConfigError`, not retried.

Failures keep the package's three kinds apart:

* the server cannot be reached, answers 5xx, is full or draining, or has lost the session: the
  call is retried with exponential backoff, then :class:`EnvServerError` (an
  :class:`~areal_agents.errors.InfrastructureError`: the trainer drops and counts the episode,
  never scores it 0). Every ``reset`` and ``step`` carries a request id and the server answers a
  retry with the first result, so a retried step is never applied twice;
* the request is wrong: the error the local environment would raise (``ResetNeeded``,
  ``TypeError``, :class:`~areal_agents.errors.ConfigError`), else :class:`RemoteEnvError`;
* the environment itself failed (a bug on the server): :class:`RemoteEnvError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import logging
import random
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import gymnasium as gym

from areal_agents.envs.base import Task
from areal_agents.envs.wire import (
    API_KEY_ENV,
    decode_value,
    dumps,
    resolve_api_key,
    space_from_dict,
    turn_to_dict,
)
from areal_agents.errors import (
    AgentsError,
    ConfigError,
    InfrastructureError,
    UnknownEnvironmentError,
)
from areal_agents.types import Message, Turn

__all__ = [
    "REMOTE_PREFIX",
    "ConnectionOptions",
    "EnvServerError",
    "RemoteEnv",
    "RemoteEnvError",
    "SessionLostError",
    "parse_remote",
    "register_remote",
]

logger = logging.getLogger(__name__)

#: How the command lines name a remote environment: ``remote:http://HOST:PORT/ENV_ID``.
REMOTE_PREFIX = "remote:"


class EnvServerError(InfrastructureError):
    """The environment server is down, failing, overloaded or lost the session (after retries)."""


class SessionLostError(EnvServerError):
    """The server no longer has the session (closed while idle, or the server restarted)."""


class RemoteEnvError(AgentsError, RuntimeError):
    """The server refused a request, or the environment on it raised an unexpected error."""


@dataclass(frozen=True)
class ConnectionOptions:
    """How a :class:`RemoteEnv` talks to its server."""

    timeout_s: float = 600.0
    """Longest wait for one answer (a step runs tools: allow for the slowest)."""
    connect_timeout_s: float = 5.0
    """Longest wait to connect."""
    retries: int = 5
    """Retries of a failed call (transport error, 5xx, server full) before giving up."""
    backoff_s: float = 0.2
    """First wait between retries; doubles each time (with jitter)."""
    max_backoff_s: float = 5.0
    """Longest wait between retries."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError("remote timeout_s and connect_timeout_s must be positive seconds")
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("remote retries, backoff_s and max_backoff_s must be 0 or more")

    @classmethod
    def from_query(cls, query: str) -> ConnectionOptions:
        """Options from a URL query string (``timeout_s=60&retries=3``)."""
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key not in fields:
                raise ConfigError(
                    f"unknown remote option {key!r} in the URL; known: {', '.join(fields)}"
                )
            try:
                values[key] = int(value) if key == "retries" else float(value)
            except ValueError:
                raise ConfigError(f"remote option {key}={value!r} is not a number") from None
        return cls(**values)


def parse_remote(name: str) -> tuple[str, str | None, ConnectionOptions]:
    """``(server URL, env id or None, options)`` of ``[remote:]SCHEME://HOST:PORT[/ENV_ID][?opts]``.

    >>> parse_remote("remote:http://127.0.0.1:8100/areal_agents/Calculator-v0")[:2]
    ('http://127.0.0.1:8100', 'areal_agents/Calculator-v0')
    """
    url = name[len(REMOTE_PREFIX) :] if name.startswith(REMOTE_PREFIX) else name
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ConfigError(
            f"{name!r} is not a remote environment: write remote:http://HOST:PORT/ENV_ID "
            "(or remote:ws://... for the WebSocket transport)"
        )
    env_id = parts.path.strip("/") or None
    return f"{parts.scheme}://{parts.netloc}", env_id, ConnectionOptions.from_query(parts.query)


def register_remote(name: str) -> str:
    """Register ``remote:URL`` as a Gymnasium id (once) and return the id.

    ``gym.make(id, **kwargs)`` then builds a :class:`RemoteEnv` for that server, so code that
    resolves names to ids and calls ``gym.make`` (the trainer, eval) takes remote environments.

    >>> register_remote("remote:http://127.0.0.1:8100/calculator")
    'remote/http_127.0.0.1_8100_calculator-v0'
    """
    url, env_id, options = parse_remote(name)
    slug = re.sub(r"[^\w.]+", "_", f"{url}/{env_id or ''}".replace("://", "_")).strip("_")
    gym_id = f"remote/{slug}-v0"
    kwargs = {"url": url, "env_id": env_id, "connection": options}
    spec = gym.registry.get(gym_id)
    if spec is not None and spec.kwargs != kwargs:  # same slug, other URL: tell them apart
        gym_id = f"remote/{slug}_{uuid.uuid5(uuid.NAMESPACE_URL, name).hex[:8]}-v0"
        spec = gym.registry.get(gym_id)
    if spec is None:
        gym.register(id=gym_id, entry_point="areal_agents.envs.remote:RemoteEnv", kwargs=kwargs)
    return gym_id


class _Transport:
    """One connection to the server; ``call`` returns ``(status, body)`` or raises OSError-like
    :class:`_TransportError` when nothing came back."""

    def call(self, op: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _TransportError(Exception):
    """Nothing came back; ``timed_out``: the server took longer than ``timeout_s`` to answer."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class _Http(_Transport):
    """HTTP/1.1 keep-alive on the standard library's client (a fraction of httpx's cost per
    request, which matters on a loopback step of well under a millisecond)."""

    def __init__(self, url: str, options: ConnectionOptions, headers: Mapping[str, str]) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.options = options
        self.headers = {"Content-Type": "application/json", **headers}
        self.conn: http.client.HTTPConnection | None = None

    def call(self, op: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        data = dumps(body)
        for fresh in (False, True):
            reused = self.conn is not None
            sent = False
            try:
                if self.conn is None:
                    kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
                    self.conn = kind(self.host, self.port, timeout=self.options.connect_timeout_s)
                    self.conn.connect()
                    self.conn.sock.settimeout(self.options.timeout_s)
                self.conn.request("POST", f"/{op}", body=data, headers=self.headers)
                sent = True
                response = self.conn.getresponse()
                raw = response.read()
                if response.will_close:
                    self.close()
                break
            except (OSError, http.client.HTTPException) as e:
                self.close()
                # a kept-alive connection the server has closed fails before any answer: try
                # once more on a new one at once (the request id makes a repeat harmless)
                stale = isinstance(e, http.client.RemoteDisconnected | BrokenPipeError)
                if reused and stale and not fresh:
                    continue
                raise _TransportError(
                    f"{type(e).__name__}: {e}", timed_out=sent and isinstance(e, TimeoutError)
                ) from None
        try:
            return response.status, json.loads(raw)
        except ValueError:
            text = raw[:200].decode(errors="replace")
            return response.status, {"error": {"type": "BadResponse", "message": text}}

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class _WebSocket(_Transport):
    def __init__(self, url: str, options: ConnectionOptions, headers: Mapping[str, str]) -> None:
        try:
            import websockets.sync.client  # noqa: F401
        except ImportError:
            from areal_agents.errors import DependencyError

            raise DependencyError.missing("websockets", "train") from None
        self.url = f"{url}/ws"
        self.options = options
        self.headers = dict(headers)
        self.ws: Any = None
        self.stack = contextlib.ExitStack()
        self.counter = 0

    def call(self, op: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from websockets.exceptions import InvalidStatus, WebSocketException
        from websockets.sync.client import connect

        sent = False
        try:
            if self.ws is None:
                self.stack = contextlib.ExitStack()  # connections are context managers now
                self.ws = self.stack.enter_context(
                    connect(
                        self.url,
                        open_timeout=self.options.connect_timeout_s,
                        max_size=None,
                        compression=None,
                        proxy=None,
                        additional_headers=self.headers,
                    )
                )
            self.counter += 1
            self.ws.send(dumps({"op": op, "id": self.counter, **body}).decode())
            sent = True
            while True:
                reply = json.loads(self.ws.recv(timeout=self.options.timeout_s))
                if reply.get("id") == self.counter:
                    break
        except InvalidStatus as e:  # the handshake was refused: say so as HTTP would
            self.close()
            status = e.response.status_code
            if status in (401, 403):
                return status, {"error": {"type": "Unauthorized", "message": str(e)}}
            raise _TransportError(f"{type(e).__name__}: {e}") from None
        except (OSError, TimeoutError, WebSocketException) as e:
            self.close()  # reconnect on the next call
            timed_out = sent and isinstance(e, TimeoutError)  # sent, and no answer in time
            raise _TransportError(f"{type(e).__name__}: {e}", timed_out=timed_out) from None
        return int(reply["status"]), reply.get("result") or {"error": reply.get("error")}

    def close(self) -> None:
        if self.ws is not None:
            self.ws = None
            try:
                self.stack.close()
            except Exception:
                logger.debug("closing the websocket failed", exc_info=True)


_RETRYABLE = {"TooManySessions", "ServerDraining"}


class RemoteEnv(gym.Env[Any, Any]):
    """A :class:`gymnasium.Env` whose environment runs on an environment server.

    Args:
        url: the server (``http://HOST:PORT`` or ``ws://HOST:PORT``); may carry the id as its
            path (``http://HOST:PORT/calculator``) and options as its query.
        env_id: the environment the server should be serving (an alias or id); None accepts
            whatever it serves.
        render_mode: passed to the server's ``gym.make``.
        connection: timeouts and retries (:class:`ConnectionOptions`).
        api_key: the server's API key (default: the environment variable
            ``AREAL_ENV_API_KEY``; none sent when neither is set).
        **env_kwargs: the environment's own keyword arguments.

    ``messages`` mirrors the conversation the remote environment recorded (for chat
    environments), like :attr:`~areal_agents.envs.base.MultiTurnEnv.messages` of a local one.
    """

    def __init__(
        self,
        url: str,
        env_id: str | None = None,
        *,
        render_mode: str | None = None,
        connection: ConnectionOptions | Mapping[str, Any] | None = None,
        api_key: str | None = None,
        **env_kwargs: Any,
    ) -> None:
        base, path_id, from_query = parse_remote(url)
        if isinstance(connection, Mapping):
            known = {f.name for f in dataclasses.fields(ConnectionOptions)}
            unknown = sorted(set(connection) - known)
            if unknown:
                raise ConfigError(f"unknown connection options {unknown}; known: {sorted(known)}")
            connection = ConnectionOptions(**connection)
        self.url = base
        self.connection = connection or from_query
        self.env_id = env_id or path_id
        self.env_kwargs = dict(env_kwargs)
        if render_mode is not None:
            self.env_kwargs["render_mode"] = render_mode
        self.render_mode = render_mode
        self.session_id: str | None = None
        self.messages: list[Message] = []
        self._chat = False
        key = resolve_api_key(api_key)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        websocket = base.startswith(("ws://", "wss://"))
        self._transport: _Transport = (
            _WebSocket(base, self.connection, headers)
            if websocket
            else _Http(base, self.connection, headers)
        )
        try:
            described = self._call("spaces", {})
        except BaseException:
            self._transport.close()
            raise
        self.served_id = described.get("env_id")
        self.observation_space = space_from_dict(described["observation_space"])
        self.action_space = space_from_dict(described["action_space"])
        self._metadata = {"render_modes": [], "render_fps": None, **described.get("metadata", {})}

    @property
    def metadata(self) -> dict[str, Any]:
        """The served environment's metadata (an instance property: Gymnasium then does not
        check ``render_mode`` against the class before the server is asked)."""
        return self._metadata

    @metadata.setter
    def metadata(self, value: dict[str, Any]) -> None:
        self._metadata = value

    # ---- gymnasium API -----------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        if options and isinstance(options.get("task"), Task):  # as Task.from_mapping reads it
            task = options["task"]
            row = {**task.metadata, "id": task.id, "prompt": task.prompt, "answer": task.answer}
            options = {**options, "task": row}
        body: dict[str, Any] = {"seed": seed, "options": options}
        if self.session_id is not None:
            try:
                out = self._call("reset", {**body, "session_id": self.session_id})
            except SessionLostError as e:  # e.g. closed while idle: a new episode needs none of it
                logger.info("session %s is gone (%s): opening a new one", self.session_id, e)
                self.session_id = None
        if self.session_id is None:
            out = self._call("reset", body)
            self.session_id = out["session_id"]
        obs = decode_value(self.observation_space, out["observation"])
        self._chat = isinstance(obs, list) and all(isinstance(m, dict) for m in obs)
        self.messages = [Message.from_openai(m) for m in obs] if self._chat else []
        return obs, out["info"]

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.session_id is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        body: dict[str, Any] = {"session_id": self.session_id}
        if isinstance(action, Turn):
            body.update(action=turn_to_dict(action), action_kind="turn")
        else:
            body.update(action=action, action_kind="value")
        out = self._call("step", body)
        obs = decode_value(self.observation_space, out["observation"])
        if self._chat:
            if "assistant" in out:
                recorded = Message.from_openai(out["assistant"])
                turn_id = action.id if isinstance(action, Turn) else ""
                self.messages.append(dataclasses.replace(recorded, turn_id=turn_id))
            elif isinstance(action, Turn):
                self.messages.append(Message.from_turn(action))
            if isinstance(obs, list):
                self.messages.extend(Message.from_openai(m) for m in obs)
        return obs, out["reward"], out["terminated"], out["truncated"], out["info"]

    def render(self) -> Any:
        if self.session_id is None:
            return None
        return self._call("render", {"session_id": self.session_id})["render"]

    def close(self) -> None:
        """Close the remote session (best effort: a server that is gone reaps it) and the
        connection. Closing twice is allowed."""
        if self.session_id is not None:
            session, self.session_id = self.session_id, None
            try:
                self._call("close", {"session_id": session}, retries=1)
            except AgentsError as e:
                logger.warning("closing remote session %s failed: %s", session, e)
        self._transport.close()
        super().close()

    # ---- machinery ---------------------------------------------------------------------------

    def _call(self, op: str, body: dict[str, Any], retries: int | None = None) -> dict[str, Any]:
        """One operation, retried on transport errors and 503s with the same request id."""
        payload = {**body, "request_id": uuid.uuid4().hex}
        if op in ("spaces", "reset"):
            payload.update(env_id=self.env_id, kwargs=self.env_kwargs)
        attempts = 1 + (self.connection.retries if retries is None else retries)
        problem = ""
        for attempt in range(attempts):
            if attempt:
                delay = min(
                    self.connection.max_backoff_s, self.connection.backoff_s * 2 ** (attempt - 1)
                )
                time.sleep(delay * (0.5 + random.random() / 2))
            try:
                status, answer = self._transport.call(op, payload)
            except _TransportError as e:
                if e.timed_out:  # a retry would wait for the same stuck call: give up now
                    raise EnvServerError(
                        f"{op} on {self.url}: no answer within {self.connection.timeout_s:g} s "
                        "(ConnectionOptions.timeout_s)"
                    ) from None
                problem = str(e)
                continue
            if status == 200:
                return answer
            error = answer.get("error") or {}
            kind, message = str(error.get("type", "")), str(error.get("message", ""))
            if kind in _RETRYABLE or (status >= 500 and kind == "BadResponse"):
                problem = f"{status} {kind}: {message}"  # full, draining, or a proxy's 5xx
                continue
            raise self._error(op, status, kind, message)
        raise EnvServerError(
            f"{op} on the environment server {self.url} failed after {attempts} attempt(s): "
            f"{problem}"
        )

    def _error(self, op: str, status: int, kind: str, message: str) -> Exception:
        where = f"{op} on {self.url}"
        if status == 401 or kind == "Unauthorized":
            return ConfigError(
                f"{where}: the server wants its API key: set {API_KEY_ENV} (or pass api_key) "
                f"to the key it was started with ({message})"
            )
        if kind == "UnknownSession":
            return SessionLostError(f"{where}: the server lost the session: {message}")
        if status >= 500 and kind != "EnvironmentError":  # the sandbox failed, or the server
            return EnvServerError(f"{where}: {status} {kind}: {message}")
        if kind == "ResetNeeded":
            return gym.error.ResetNeeded(message)
        if kind == "UnknownEnvironment" or kind == "UnknownEnvironmentError":
            return UnknownEnvironmentError(f"{where}: {message}")
        if status == 422 or kind in ("KwargNotAllowed", "TaskNotAllowed"):
            return ConfigError(f"{where}: {message}")
        if kind == "TypeError":
            return TypeError(message)
        return RemoteEnvError(f"{where}: {status} {kind}: {message}")
