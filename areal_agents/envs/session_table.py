"""The session table of the environment server: open sessions by id, the calls run on them,
and the policy that closes idle ones.

:class:`SessionTable` holds the part of :class:`~areal_agents.envs.sessions.SessionManager` that
keeps its sessions (one :class:`Session` each: an environment instance, its lock and the results
of its recent requests): looking a session up by id (and saying why one is gone), running a
call on a session's turn in a worker thread (a retried request id gets the first result),
making room by eviction, reaping idle sessions and closing them all at shutdown. What a
client's request does with a session (open, reset, step, render, close) is in
:mod:`areal_agents.envs.sessions`.

* Every environment call runs in a worker thread (tools block on sandboxes), one at a time per
  session and in arrival order; sessions run concurrently.
* ``max_sessions`` bounds open sessions. When all are open, opening one closes the session idle
  longest (one not in a call), so that sessions held idle cannot lock other clients out; only
  when every session is in a call is the answer ``503 TooManySessions``. ``evict_idle_s > 0``
  spares sessions used more recently than that (an over-subscribed trainer then waits for a
  slot instead of losing episodes, but a client holding every slot locks others out for that
  long). Sessions idle for ``idle_timeout_s`` are closed by :meth:`SessionTable.reap_idle`.
* Whatever an environment raises is caught in its thread and answered as an error of that request
  only; it never reaches the event loop or another session (the mapping from exception to
  status is :func:`areal_agents.envs.request_errors.as_request_error`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import gymnasium as gym

from areal_agents.envs.request_checks import check_same_request, fingerprint
from areal_agents.envs.request_errors import RequestError, as_request_error

__all__ = ["Session", "SessionTable"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_MEMORY = 1024  # results of session openings, and ids of expired sessions, remembered
_RESULTS_PER_SESSION = 8  # results kept per session for retried requests


@dataclass
class Session:
    """One open session: its environment (None while it is being made), the lock that runs its
    calls one at a time, when it was last used, the results of its recent requests by request
    id (with the fingerprint of each request's body), and whether it was closed."""

    id: str
    env: gym.Env[Any, Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    results: OrderedDict[str, tuple[str, asyncio.Task[Any]]] = field(default_factory=OrderedDict)
    closed: bool = False


class SessionTable:
    """The open sessions of :class:`~areal_agents.envs.sessions.SessionManager` (see the module
    docstring).

    A mixin: it has no state of its own and works on the attributes declared below, which the
    manager sets up.
    """

    max_sessions: int
    idle_timeout_s: float
    evict_idle_s: float
    evicted: int  # idle sessions closed to make room
    _sessions: dict[str, Session]
    _expired: OrderedDict[str, str]  # session id -> why it is gone
    _pool: concurrent.futures.ThreadPoolExecutor

    # ---- eviction, reaping, shutdown -------------------------------------------------------

    async def _evict_one(self) -> bool:
        """Close the session idle longest, if unused for ``evict_idle_s``; whether one was."""
        now = time.monotonic()
        idle = [
            s
            for s in self._sessions.values()
            if s.env is not None and not s.lock.locked() and now - s.last_used >= self.evict_idle_s
        ]
        if not idle:
            return False
        oldest = min(idle, key=lambda s: s.last_used)
        self._sessions.pop(oldest.id, None)
        self.evicted += 1
        why = f"closed after {now - oldest.last_used:.0f} s idle to make room (the server was full)"
        self._forget(oldest.id, why)
        logger.info("session %s: %s", oldest.id, why)
        await self._close(oldest)
        return True

    async def reap_idle(self) -> int:
        """Close sessions unused for ``idle_timeout_s``; returns how many."""
        now = time.monotonic()
        idle = [
            s
            for s in self._sessions.values()
            if not s.lock.locked() and now - s.last_used > self.idle_timeout_s
        ]
        for session in idle:
            self._sessions.pop(session.id, None)
            self._forget(session.id, f"closed after {self.idle_timeout_s:g} s without a request")
        await asyncio.gather(*(self._close(s) for s in idle))
        if idle:
            logger.info("closed %d idle session(s)", len(idle))
        return len(idle)

    async def run_reaper(self) -> None:
        """Reap idle sessions until cancelled."""
        while True:
            await asyncio.sleep(min(self.idle_timeout_s / 4, 5.0))
            await self.reap_idle()

    async def close_all(self) -> None:
        """Close every session (server shutdown), then the worker threads."""
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for s in sessions:
            self._forget(s.id, "the server shut down")
        await asyncio.gather(*(self._close(s) for s in sessions))
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- sessions by id, and the calls run on them -------------------------------------------

    def _session(self, session_id: Any) -> Session:
        if not isinstance(session_id, str):
            raise RequestError(400, "BadRequest", "'session_id' must be a string")
        session = self._sessions.get(session_id)
        if session is None or session.env is None:
            why = self._expired.get(session_id, "no such session")
            raise RequestError(404, "UnknownSession", f"session {session_id!r}: {why}")
        session.last_used = time.monotonic()
        return session

    def _forget(self, session_id: str, why: str) -> None:
        _remember(self._expired, session_id, why)

    async def _once(
        self,
        session: Session,
        request_id: str | None,
        fn: Callable[[], T],
        body: Mapping[str, Any] | None = None,
    ) -> T:
        """Run ``fn`` on the session's turn; a request id seen before (with the same ``body``)
        gets the first result."""
        if request_id is not None and request_id in session.results:
            seen, first = session.results[request_id]
            check_same_request(request_id, seen, body or {})
            return await asyncio.shield(first)

        async def run() -> T:
            async with session.lock:  # held until the thread is done, even if the caller left
                if session.closed:
                    raise RequestError(
                        404, "UnknownSession", f"session {session.id!r}: closed meanwhile"
                    )
                try:
                    return await self._call(fn)
                finally:
                    session.last_used = time.monotonic()

        task = asyncio.ensure_future(run())
        if request_id is not None:
            session.results[request_id] = (fingerprint(body or {}), task)
            while len(session.results) > _RESULTS_PER_SESSION:
                session.results.popitem(last=False)
        return await asyncio.shield(task)

    async def _call(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker thread; what it raises becomes a :class:`RequestError`."""
        box: list[Any] = []

        def guarded() -> None:
            try:
                box.append(fn())
            except BaseException as e:  # never let SystemExit & co. reach the event loop
                box.append(as_request_error(e))

        await asyncio.get_running_loop().run_in_executor(self._pool, guarded)
        result = box[0]
        if isinstance(result, RequestError):
            raise result
        return result

    async def _close(self, session: Session) -> None:
        async with session.lock:  # after the call under way, if any
            session.closed = True
            if session.env is None:
                return
            try:
                await self._call(session.env.close)
            except RequestError as e:
                logger.warning("closing session %s failed: %s", session.id, e.message)


def _remember(memory: OrderedDict[str, str], key: str, value: str) -> None:
    memory[key] = value
    while len(memory) > _MEMORY:
        memory.popitem(last=False)
