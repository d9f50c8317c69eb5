"""The caller's side of the grading processes: :class:`GraderPool`, a zygote and its workers.

The pool starts the zygote (:func:`~areal_agents.rewards._protocol.launch_zygote`), has it fork
workers (one fetched ahead while a job runs), gives each grade a fresh worker, waits at most a
job's time limit for its reply and kills the worker when none comes in time. How the zygote,
the workers and the limits fit together is in :mod:`.isolation`; the wire (a job's name, the
allow-listed reading of a reply) is in :mod:`._protocol`. :class:`GradingSession` holds one
grade's jobs in one worker of a pool.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import Any, TypeVar

from areal_agents.errors import ConfigError, RewardTimeout
from areal_agents.rewards._protocol import (
    DEFAULT_PRELOAD,
    MAX_REPLY_BYTES,
    GraderUnavailable,
    GradingFailed,
    _healthy_after,
    _load_reply,
    _Raised,
    _reference,
    _resource,
    _shown,
    _Worker,
    launch_zygote,
)
from areal_agents.rewards._safe_text import error_text

__all__ = ["GraderPool", "GradingSession"]

T = TypeVar("T")


class GraderPool:
    """A zygote and up to ``max_workers`` single-use workers (see :mod:`.isolation`).

    Args:
        max_workers: grades that can run at once (default: the number of CPUs, at least 2).
        memory_mb: address-space limit of each worker (``None``: no limit).
        startup_timeout_s: bound on starting the zygote and on waiting for a free worker.
        preload: modules the zygote imports and warms before it is ready.
        confine: confine each worker before its job (:mod:`._confine`: its own uid, no
            writes, no processes, no sockets). ``False`` keeps only the memory limit: for
            trusted grading code that needs the network or files, never for model text.
        spares: workers the zygote keeps forked ahead (a grade then does not wait for a fork).
    """

    def __init__(
        self,
        *,
        max_workers: int | None = None,
        memory_mb: int | None = 2048,
        startup_timeout_s: float = 120.0,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        confine: bool = True,
        spares: int = 1,
    ) -> None:
        self.max_workers = max_workers or max(2, os.cpu_count() or 2)
        if self.max_workers < 1:
            raise ConfigError(f"max_workers={max_workers}: must be at least 1")
        if spares < 0:
            raise ConfigError(f"spares={spares}: must be 0 or more")
        self.memory_mb = memory_mb
        self.startup_timeout_s = startup_timeout_s
        self.preload = tuple(preload)
        self.confine = confine
        self.spares = spares
        self._reset_state()
        self._finalizer = weakref.finalize(self, GraderPool._shutdown, self._state)

    def _reset_state(self) -> None:
        self._owner = os.getpid()
        self._cond = threading.Condition()
        self._zlock = threading.Lock()
        self._workers: set[_Worker] = set()  # every worker not yet discarded
        self._ready: list[_Worker] = []  # fresh workers fetched ahead (not at work)
        self._live = 0  # workers at work
        # the zygote: process, control connection, ready flag, prepared modules, pids to reap
        self._state: dict[str, Any] = {"proc": None, "conn": None, "ready": False}
        self._zmodules: set[str] = set()
        self._to_reap: list[int] = []

    # -- lifecycle

    def start(self, *, modules: Sequence[str] = (), wait: bool = False) -> None:
        """Start the zygote now, so that the first grade finds it warm.

        ``modules`` are imported (and warmed) in it too when it is not running yet; otherwise
        on their first use. ``wait=True`` waits (up to ``startup_timeout_s``) until it is ready.
        """
        self._check_owner()
        with self._zlock:
            if self._state["proc"] is None:
                self._spawn_zygote(extra=modules)
            if wait:
                self._zygote(time.monotonic() + self.startup_timeout_s)

    def close(self) -> None:
        """Stop the zygote and every worker; a later :meth:`run` starts them again."""
        self._check_owner()
        with self._cond:
            workers, self._live = list(self._workers), 0
            self._workers, self._ready = set(), []
        for worker in workers:
            worker.close()
        with self._zlock:
            GraderPool._shutdown(self._state)
            self._zmodules = set()
            self._to_reap = []

    @staticmethod
    def _shutdown(state: dict[str, Any]) -> None:
        conn, proc = state.get("conn"), state.get("proc")
        state.update(proc=None, conn=None, ready=False)
        if conn is not None:
            conn.close()  # EOF: the zygote kills its workers and exits
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _check_owner(self) -> None:
        if os.getpid() != self._owner:
            self._abandon_after_fork()

    def _abandon_after_fork(self) -> None:
        """In a forked child: close our copies of the parent's sockets (so that the zygote
        still sees the parent's end close when the parent dies) and start afresh."""
        self._finalizer.detach()
        conn = self._state.get("conn")
        if conn is not None:
            conn.close()
        for worker in list(self._workers):
            worker.close()
        self._reset_state()
        self._finalizer = weakref.finalize(self, GraderPool._shutdown, self._state)

    def _spawn_zygote(self, extra: Sequence[str] = ()) -> None:
        preload = list(dict.fromkeys([*self.preload, *extra]))
        config = {
            "preload": preload,
            "memory_mb": self.memory_mb,
            "confine": self.confine,
            "spares": self.spares,
        }
        proc, conn = launch_zygote(config)  # with none of the caller's variables
        self._state.update(proc=proc, conn=conn, ready=False)
        self._zmodules = set(preload)

    def _zygote(self, deadline: float) -> Connection:
        """The ready zygote's connection (caller holds ``_zlock``), started if needed."""
        for attempt in (1, 2):
            if self._state["proc"] is None or self._state["proc"].poll() is not None:
                GraderPool._shutdown(self._state)
                self._to_reap = []
                self._spawn_zygote()
            conn: Connection = self._state["conn"]
            if self._state["ready"]:
                return conn
            try:
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise GraderUnavailable(
                        f"the grading process did not start within {self.startup_timeout_s:g} s"
                    )
                conn.recv()  # ("ready", pid)
                self._state["ready"] = True
                return conn
            except (EOFError, OSError):
                code = self._state["proc"].wait()
                GraderPool._shutdown(self._state)
                if attempt == 2:
                    raise GraderUnavailable(
                        f"the grading process exited during start-up (exit code {code}); "
                        "its error is on stderr"
                    ) from None
        raise AssertionError("unreachable")

    def _zcall(self, request: tuple[Any, ...], deadline: float) -> Any:
        """One request to the zygote and its reply (caller holds ``_zlock``)."""
        conn = self._zygote(deadline)
        try:
            with self._cond:
                pids, self._to_reap = self._to_reap, []
            conn.send(request)
            if pids:  # after the request: the zygote answers first, then reaps
                conn.send(("reap", pids))
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                GraderPool._shutdown(self._state)  # a stuck zygote is replaced
                raise GraderUnavailable("the grading process stopped answering")
            return conn.recv()
        except (EOFError, OSError) as e:
            GraderPool._shutdown(self._state)
            raise GraderUnavailable(f"the grading process died: {e}") from e

    def _prepare(self, module: str, deadline: float) -> None:
        """Make the zygote import ``module`` (its later workers have it)."""
        with self._zlock:
            if module in self._zmodules:
                return
            reply = self._zcall(("prepare", module), deadline)
            if reply[0] != "ok":
                raise GraderUnavailable(f"the grading process cannot import {module}: {reply}")
            self._zmodules.add(module)

    # -- workers

    def _fork(self, deadline: float) -> _Worker:
        with self._zlock:
            for attempt in (1, 2):
                try:
                    _, pid = self._zcall(("fork",), deadline)
                    fd = recv_handle(self._state["conn"])
                    break
                except GraderUnavailable:
                    if attempt == 2:
                        raise
            modules = set(self._zmodules)
        pidfd = None
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(pid)
        worker = _Worker(pid, Connection(fd), pidfd, modules)
        with self._cond:
            self._workers.add(worker)
        return worker

    def _slot(self, deadline: float) -> None:
        """Wait until fewer than ``max_workers`` jobs run, and count one more."""
        with self._cond:
            while self._live >= self.max_workers:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise GraderUnavailable(
                        f"no grading worker became free within {self.startup_timeout_s:g} s "
                        f"({self.max_workers} busy)"
                    )
            self._live += 1

    def _unslot(self) -> None:
        with self._cond:
            self._live -= 1
            self._cond.notify()

    def _take(self, module: str, deadline: float) -> _Worker:
        """A fresh worker (never used) that has ``module``: one fetched ahead, or a new fork."""
        for _ in range(3):
            self._prepare(module, deadline)
            with self._cond:
                worker = self._ready.pop() if self._ready else None
            if worker is None:
                worker = self._fork(deadline)
            elif worker.conn.poll(0):  # a fresh worker says nothing: this one died waiting
                self._discard(worker)
                continue
            if module in worker.modules:
                return worker
            self._discard(worker)  # forked before the zygote had the module
        raise GraderUnavailable(f"no grading worker could import {module}")

    def _fetch_ahead(self, deadline: float) -> None:
        """Have the next worker ready (called while a job runs, so that the round trip to the
        zygote overlaps it)."""
        with self._cond:
            if self._ready:
                return
        try:
            worker = self._fork(deadline)
        except GraderUnavailable:
            return  # the next job forks its own
        with self._cond:
            if worker in self._workers:
                self._ready.append(worker)
                return
        worker.close()  # the pool was closed meanwhile

    def _discard(self, worker: _Worker) -> None:
        """Kill a worker (it may be exiting already); the zygote reaps it later."""
        worker.kill()
        with self._cond:
            if worker in self._workers:
                self._workers.discard(worker)
                self._to_reap.append(worker.pid)  # reaped by the zygote with its next request

    # -- the public verbs

    def run(self, fn: Callable[..., T], *args: Any, timeout_s: float, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a fresh worker, killed after ``timeout_s`` seconds.

        ``fn`` must be a module-level function (it is imported by name in the zygote);
        arguments and result travel by pickle. Raises :class:`RewardTimeout` when the limit
        passes, :class:`GradingFailed` when the worker dies on this input (or runs out of
        memory), :class:`GraderUnavailable` when no worker can be had; any other exception
        raised by ``fn`` is raised here.
        """
        with self.session() as session:
            return session.run(fn, *args, timeout_s=timeout_s, **kwargs)

    def session(self) -> GradingSession:
        """A worker for the several jobs of **one** grade (the rounds of a unit-test verdict):
        fresh when the grade starts, kept between its jobs unless one fails, discarded when
        the session closes. Use it as a context manager."""
        self._check_owner()
        return GradingSession(self)

    def _call(
        self,
        worker: _Worker | None,
        fn: Callable[..., Any],
        args: Any,
        kwargs: Any,
        timeout_s: float,
    ) -> tuple[_Worker | None, Any]:
        """One job: in ``worker``, or a fresh one. Returns the worker (``None`` when it was
        discarded) and the reply, or raises (see :meth:`run`)."""
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s={timeout_s!r}: must be a positive number of seconds")
        module, qualname = _reference(fn)
        self._check_owner()
        deadline = time.monotonic() + self.startup_timeout_s
        self._slot(deadline)
        try:
            problem: BaseException | None = None
            for _ in range(3):
                fresh = worker is None or module not in worker.modules
                if fresh:
                    if worker is not None:
                        self._discard(worker)
                    worker = self._take(module, deadline)
                assert worker is not None
                try:
                    worker.conn.send(("call", module, qualname, args, kwargs))
                except (EOFError, OSError) as e:  # it died before the job: use another
                    self._discard(worker)
                    worker, problem = None, e
                    continue
                except BaseException:
                    self._discard(worker)
                    raise
                if fresh:
                    self._fetch_ahead(deadline)
                return self._wait(worker, qualname, timeout_s)
            raise GraderUnavailable(f"grading workers keep dying: {problem}")
        finally:
            self._unslot()

    def _wait(self, worker: _Worker, name: str, timeout_s: float) -> tuple[_Worker | None, Any]:
        keep = False
        try:
            if not worker.conn.poll(timeout_s):
                raise RewardTimeout(
                    f"{name} did not finish within {timeout_s:g} s (the grading process was killed)"
                )
            try:
                data = worker.conn.recv_bytes(MAX_REPLY_BYTES)
            except (EOFError, OSError):
                raise GradingFailed(f"the grading process died while running {name}") from None
            try:
                reply = _load_reply(data)
            except Exception as e:  # not a reply this process will read (see _load_reply)
                raise GradingFailed(f"{name}: its reply cannot be read: {error_text(e)}") from None
            status, value = reply[0], reply[1]
            keep = status == "ok" or (status == "raised" and _healthy_after(value))
        finally:
            if not keep:
                self._discard(worker)
        kept = worker if keep else None
        if status == "ok":
            return kept, value
        if status == "unpicklable":
            raise GradingFailed(f"{name}: {_shown(value)} ({_shown(reply[2])})")
        if isinstance(value, MemoryError | RecursionError):
            raise GradingFailed(f"{name} ran out of {_resource(value)} on this input") from None
        if not isinstance(value, Exception):  # SystemExit, KeyboardInterrupt: not ours to raise
            raise GradingFailed(f"{name} raised {error_text(value)}") from None
        raise _Raised(kept, value)


class GradingSession:
    """The jobs of one grade in one worker (see :meth:`GraderPool.session`)."""

    def __init__(self, pool: GraderPool) -> None:
        self.pool = pool
        self._worker: _Worker | None = None

    def run(self, fn: Callable[..., T], *args: Any, timeout_s: float, **kwargs: Any) -> T:
        """As :meth:`GraderPool.run`, in this grade's worker (a fresh one after a failure)."""
        try:
            self._worker, value = self.pool._call(self._worker, fn, args, kwargs, timeout_s)
        except _Raised as raised:
            self._worker = raised.worker
            raise raised.error from None
        except BaseException:
            self._worker = None  # discarded with the failure
            raise
        return value

    def close(self) -> None:
        """Discard the worker: nothing of this grade reaches another."""
        worker, self._worker = self._worker, None
        if worker is not None:
            self.pool._discard(worker)

    def __enter__(self) -> GradingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
