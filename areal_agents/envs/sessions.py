"""The sessions of the environment server: one environment instance each, run off the event loop.

:class:`SessionManager` is the transport-free core of ``python -m areal_agents.envs.serve``: the
HTTP routes and the WebSocket loop both call its coroutines with the request's JSON body and send
back what they return (or the :class:`RequestError` they raise).

* ``reset`` without a ``session_id`` opens a session: ``gym.make`` of the served environment with
  the server's keyword arguments and those the client may set. ``step``, ``render`` and ``close``
  take the id. Ids are random and unguessable; sessions never share an environment instance.
* A ``request_id`` makes a retried ``reset`` or ``step`` safe: a request whose id the session has
  seen gets the result of the first one (waiting for it if it still runs) instead of a second
  application. Opening a session is deduplicated the same way.
* A client's task (``options={"task": {...}}``) that carries code the graders execute (the keys
  in :data:`CODE_TASK_KEYS`: unit tests and their preamble run on this host, a reasoning-gym
  entry is handed to its dataset's own scorer) is refused (``403 TaskNotAllowed``) unless the
  manager was made with ``trust_client_tasks=True``: the server runs no client's code.
* A request id names one request: the same id with another body is refused (``409``), so a
  client that reuses a fixed id cannot get another client's session or result.
* ``max_sessions`` bounds open sessions; when all are open, opening one evicts the session idle
  longest, or is answered ``503 TooManySessions``. After
  :meth:`SessionManager.start_draining` new work gets ``503 ServerDraining`` while the calls under
  way finish (:attr:`SessionManager.in_flight`).

How sessions are kept and their calls run — worker threads, one call at a time per session,
eviction, reaping of idle sessions, errors caught in their thread — is in
:mod:`areal_agents.envs.session_table` (:class:`~areal_agents.envs.session_table.SessionTable`,
which :class:`SessionManager` inherits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import gymnasium as gym

from areal_agents.envs.base import MultiTurnEnv
from areal_agents.envs.registry import resolve_env_id
from areal_agents.envs.request_checks import (
    CODE_TASK_KEYS,
    canonical_env_id,
    check_env_id,
    check_kwargs,
    check_same_request,
    check_seed,
    check_task,
    fingerprint,
)
from areal_agents.envs.request_errors import RequestError, request_id_of
from areal_agents.envs.session_table import _MEMORY, Session, SessionTable
from areal_agents.envs.wire import (
    PROTOCOL_VERSION,
    decode_value,
    space_to_dict,
    turn_from_dict,
)
from areal_agents.errors import ConfigError, UnknownEnvironmentError

__all__ = [
    "CODE_TASK_KEYS",
    "DEFAULT_CLIENT_KWARGS",
    "RequestError",
    "SessionManager",
    "canonical_env_id",
]

#: Keyword arguments a client may pass to ``gym.make`` unless the server says otherwise: they
#: shape episodes but cannot reach the server's files or weaken its sandbox.
DEFAULT_CLIENT_KWARGS = ("max_turns", "max_tool_output_chars", "render_mode", "system_prompt")


class SessionManager(SessionTable):
    """The sessions of one served environment (see the module docstring); how they are kept,
    evicted and reaped comes from :class:`~areal_agents.envs.session_table.SessionTable`.

    Args:
        env: the environment's alias, Gymnasium id or ``module:Env-v0`` (as ``env=`` takes it).
        env_kwargs: keyword arguments of every ``gym.make``; clients cannot change them.
        client_kwargs: keys clients may add to them (``("*",)``: any key).
        max_sessions: sessions open at once.
        idle_timeout_s: a session unused for this long is closed.
        evict_idle_s: when ``max_sessions`` are open, the longest-idle session unused for at
            least this long is closed to make room for a new one (0: any not in a call).
        trust_client_tasks: accept client tasks that carry code (:data:`CODE_TASK_KEYS`): any
            client can then run code on this host as the server's user.
        code_task_keys: the task keys that count as code (add those a custom grader executes).
        threads: worker threads for environment calls (default: ``max_sessions``, at most 512).
    """

    def __init__(
        self,
        env: str,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        client_kwargs: Iterable[str] = DEFAULT_CLIENT_KWARGS,
        max_sessions: int = 256,
        idle_timeout_s: float = 600.0,
        evict_idle_s: float = 0.0,
        trust_client_tasks: bool = False,
        code_task_keys: Iterable[str] = CODE_TASK_KEYS,
        threads: int | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ConfigError(f"max_sessions={max_sessions}: must be at least 1")
        if idle_timeout_s <= 0:
            raise ConfigError(f"idle_timeout_s={idle_timeout_s}: must be positive seconds")
        if evict_idle_s < 0:
            raise ConfigError(f"evict_idle_s={evict_idle_s}: must be 0 or more seconds")
        self.env_name = env
        self.env_id = resolve_env_id(env)
        self.env_kwargs = dict(env_kwargs or {})
        self.client_kwargs = frozenset(client_kwargs)
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.evict_idle_s = evict_idle_s
        self.trust_client_tasks = trust_client_tasks
        self.code_task_keys = frozenset(code_task_keys)
        self.evicted = 0  # idle sessions closed to make room
        self.draining = False
        self.in_flight = 0
        self.opened = 0  # sessions opened since start
        self.steps = 0  # steps applied since start
        self._count_lock = threading.Lock()
        self.started = time.monotonic()
        self._sessions: dict[str, Session] = {}
        self._opening: OrderedDict[str, tuple[str, asyncio.Task[Any]]] = OrderedDict()  # by id
        self._expired: OrderedDict[str, str] = OrderedDict()  # session id -> why it is gone
        self._spaces: dict[str, dict[str, Any]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            threads or min(max_sessions, 512), thread_name_prefix="areal-env"
        )
        module, _, self._make_id = self.env_id.rpartition(":")
        try:
            if module:  # Gymnasium's "module:Env-v0": the module registers the environment
                importlib.import_module(module)
            gym.spec(self._make_id)
        except (ImportError, gym.error.Error) as e:
            raise UnknownEnvironmentError(f"cannot serve {env!r}: {e}") from None

    # ---- what the transports call ------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health``: status, the served environment and the load."""
        return {
            "status": "draining" if self.draining else "ok",
            "env": self.env_name,
            "env_id": canonical_env_id(self.env_id),
            "protocol": PROTOCOL_VERSION,
            "sessions": len(self._sessions),
            "max_sessions": self.max_sessions,
            "in_flight": self.in_flight,
            "sessions_opened": self.opened,
            "sessions_evicted": self.evicted,
            "steps": self.steps,
            "idle_timeout_s": self.idle_timeout_s,
            "uptime_s": round(time.monotonic() - self.started, 3),
        }

    async def spaces(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /spaces``: the spaces and metadata an environment made with ``kwargs`` has."""
        self._check_env_id(body)
        kwargs = self._kwargs(body)
        key = json.dumps(kwargs, sort_keys=True, default=repr)
        if key not in self._spaces:

            def describe() -> dict[str, Any]:
                env = self._make(kwargs)
                try:
                    return self._describe(env)
                finally:
                    env.close()

            async with self._track():
                described = await self._call(describe)
            if len(self._spaces) >= 256:  # distinct argument sets are few; bound them anyway
                self._spaces.clear()
            self._spaces[key] = described
        return self._spaces[key]

    async def reset(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /reset``: a new episode, in a new session when ``session_id`` is absent."""
        check_seed(body.get("seed"))
        check_task(body.get("options"), self.code_task_keys, self.trust_client_tasks)
        request_id = request_id_of(body)
        session_id = body.get("session_id")
        if session_id is not None:
            session = self._session(session_id)
            async with self._track():
                return await self._once(session, request_id, self._resetter(session, body), body)
        if request_id is not None and request_id in self._opening:  # a retried open
            first, opening = self._opening[request_id]
            check_same_request(request_id, first, body)
            return await asyncio.shield(opening)
        async with self._track():
            task = asyncio.ensure_future(self._open_and_reset(body, request_id))
            if request_id is not None:
                self._opening[request_id] = (fingerprint(body), task)
                while len(self._opening) > _MEMORY:
                    self._opening.popitem(last=False)
            return await asyncio.shield(task)

    def _resetter(
        self, session: Session, body: Mapping[str, Any], created: bool = False
    ) -> Callable[[], dict[str, Any]]:
        def reset() -> dict[str, Any]:
            obs, info = session.env.reset(seed=body.get("seed"), options=body.get("options"))
            out = {"session_id": session.id, "observation": obs, "info": info}
            if created:
                out.update(self._describe(session.env))
            return out

        return reset

    async def _open_and_reset(
        self, body: Mapping[str, Any], request_id: str | None
    ) -> dict[str, Any]:
        self._check_env_id(body)
        kwargs = self._kwargs(body)
        while len(self._sessions) >= self.max_sessions:  # (again after an eviction's await)
            if not await self._evict_one():
                busy = (
                    f"none has been idle {self.evict_idle_s:g} s (--evict-idle-s)"
                    if self.evict_idle_s
                    else "each is in a call"
                )
                raise RequestError(
                    503,
                    "TooManySessions",
                    f"{len(self._sessions)} sessions are open, the limit (--max-sessions) is "
                    f"{self.max_sessions}, and {busy}; close sessions or retry later",
                )
        session = Session(secrets.token_urlsafe(16), env=None)  # type: ignore[arg-type]
        self._sessions[session.id] = session  # counts against the limit while it is made
        self.opened += 1
        async with session.lock:  # the reaper leaves it alone meanwhile
            try:
                session.env = await self._call(lambda: self._make(kwargs))
            except BaseException:
                self._sessions.pop(session.id, None)
                raise
        try:
            return await self._once(session, request_id, self._resetter(session, body, True), body)
        except RequestError:  # the client never learns the id: do not leave the session open
            if self._sessions.pop(session.id, None) is not None:
                await self._close(session)
            raise

    async def step(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /step``: apply ``action`` (``action_kind`` ``"turn"`` for a Turn dict)."""
        session = self._session(body.get("session_id"))
        if "action" not in body:
            raise RequestError(400, "BadRequest", "a step needs 'action'")
        kind = body.get("action_kind", "value")
        if kind not in ("value", "turn"):
            raise RequestError(
                400, "BadRequest", f"'action_kind' is 'value' or 'turn', not {kind!r}"
            )
        request_id = request_id_of(body)
        async with self._track():

            def step() -> dict[str, Any]:
                env = session.env
                if kind == "turn":
                    if not isinstance(body["action"], dict):
                        raise ValueError("a turn action must be an object with 'text'")
                    action = turn_from_dict(body["action"])
                else:
                    action = decode_value(env.action_space, body["action"])
                obs, reward, terminated, truncated, info = env.step(action)
                with self._count_lock:
                    self.steps += 1
                out = {
                    "observation": obs,
                    "reward": reward,
                    "terminated": terminated,
                    "truncated": truncated,
                    "info": info,
                }
                base = env.unwrapped
                if isinstance(base, MultiTurnEnv) and base.messages:
                    # the assistant message as the environment recorded it (tool-call ids it
                    # assigned), so a remote client can keep the same conversation
                    new = len(obs) if isinstance(obs, list) else 0
                    recorded = base.messages[-new - 1] if len(base.messages) > new else None
                    if recorded is not None and recorded.role == "assistant":
                        out["assistant"] = recorded.to_openai()
                return out

            return await self._once(session, request_id, step, body)

    async def render(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /render``: what ``env.render()`` returns (text for ``render_mode="ansi"``)."""
        session = self._session(body.get("session_id"))
        async with self._track():
            return await self._once(session, None, lambda: {"render": session.env.render()})

    async def close(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /close``: close the session (idempotent: ``closed`` says whether it was open)."""
        session_id = body.get("session_id")
        if not isinstance(session_id, str):
            raise RequestError(400, "BadRequest", "'session_id' must be a string")
        session = self._sessions.pop(session_id, None)
        if session is None:
            return {"closed": False}
        self._forget(session_id, "closed by the client")
        async with self._track():
            await self._close(session)
        return {"closed": True}

    # ---- lifecycle ---------------------------------------------------------------------------

    def start_draining(self) -> None:
        """Refuse new work from now on; what runs finishes (watch :attr:`in_flight`)."""
        self.draining = True

    # ---- machinery ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _track(self) -> AsyncIterator[None]:
        if self.draining:
            raise RequestError(503, "ServerDraining", "the server is shutting down")
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def _check_env_id(self, body: Mapping[str, Any]) -> None:
        check_env_id(body.get("env_id"), self.env_id, self.env_name)

    def _kwargs(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return check_kwargs(body.get("kwargs"), self.env_kwargs, self.client_kwargs)

    def _make(self, kwargs: Mapping[str, Any]) -> gym.Env[Any, Any]:
        try:
            return gym.make(self._make_id, **kwargs)
        except TypeError as e:  # an argument the environment does not take
            raise ConfigError(f"cannot make {self.env_id} with {dict(kwargs)}: {e}") from None

    @staticmethod
    def _describe(env: gym.Env[Any, Any]) -> dict[str, Any]:
        metadata = {k: v for k, v in env.metadata.items() if k in ("render_modes", "render_fps")}
        return {
            "env_id": env.spec.id if env.spec is not None else None,
            "observation_space": space_to_dict(env.observation_space),
            "action_space": space_to_dict(env.action_space),
            "metadata": metadata,
            "render_mode": env.render_mode,
        }
