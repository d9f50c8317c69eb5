r"""Grading code that can be stopped: pre-warmed worker processes, killed on a time limit.

A grade that runs model-written text through a parser can run for ever while holding the GIL:
``\boxed{9^{9^{9}}}`` asks sympy for a 370-million-digit integer, and no thread can be
interrupted in the middle of that. So rewards that parse (math-verify, reasoning-gym
verifiers, user regular expressions) call :func:`run_isolated`, which runs a module-level
function in a worker process and ``SIGKILL``\ s the worker when the time limit passes.

Speed matters as much as the limit (training grades thousands of answers on a few cores), so
processes are not spawned per grade:

* one **zygote** per process, started with this interpreter, imports the grading libraries
  once and warms them (math-verify builds its parsers lazily), then does nothing but fork;
* **workers** are forks of the zygote: a new one costs a few milliseconds and starts warm.
  Each serves one job at a time over a socket pair and stays alive for the next job; one
  that overruns its limit is killed (through a pidfd, so a recycled pid is never hit) and a
  fresh fork takes its place on the next demand;
* a job names its function by module and qualified name; the first job for a module imports
  it (and runs the module's :func:`warm_up` hooks) in the zygote and in the worker before
  the clock starts.

The time limit counts from the moment a ready worker has the job. Starting the zygote (once
per process) and waiting for a free worker when more grades run at once than ``max_workers``
are bounded separately by ``startup_timeout_s`` and fail with :class:`GraderUnavailable`, an
infrastructure error. Workers die with the zygote (parent-death signal), and the zygote exits
when this process closes its end of the control socket, or dies.

>>> run_isolated(pow, 2, 10, timeout_s=30)
1024
>>> run_isolated(pow, 9, 9**9, timeout_s=0.5)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
areal_agents.errors.RewardTimeout: pow did not finish within 0.5 s (the grading ...
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import Any, TypeVar

from areal_agents.errors import ConfigError, InfrastructureError, RewardTimeout
from areal_agents.rewards._grader import _resolve, warm_up

__all__ = [
    "GraderPool",
    "GraderUnavailable",
    "GradingFailed",
    "default_pool",
    "prewarm",
    "run_isolated",
    "warm_up",
]

T = TypeVar("T")

#: Modules every zygote imports (and warms) before it says it is ready.
DEFAULT_PRELOAD = ("areal_agents.rewards.math",)
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
    "from areal_agents.rewards._grader import _zygote_main; _zygote_main(int(sys.argv[1]))"
)
# Native thread pools and fork() do not mix: the zygote keeps every library single-threaded.
_SINGLE_THREADED = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}


class GraderUnavailable(InfrastructureError):
    """No grading worker could be started or freed in time (the answer was not graded)."""


class GradingFailed(RuntimeError):
    """The grader could not finish on this input: its process died or ran out of memory.

    Caused by the input (a memory bomb, a crash in a parser), so rewards report it as the
    status ``"error"``, not as an infrastructure fault.
    """


# ---- the pool (caller side) --------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    pid: int
    conn: Connection
    pidfd: int | None
    modules: set[str] = field(default_factory=set)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        self.conn.close()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


@functools.cache
def _reference(fn: Callable[..., Any]) -> tuple[str, str]:
    module = getattr(fn, "__module__", None) or ("builtins" if callable(fn) else None)
    qualname = getattr(fn, "__qualname__", None)
    problem = None
    if not module or not qualname or "<" in qualname or module == "__main__":
        problem = "it must be a function defined at module level in an importable module"
    else:
        try:
            found = _resolve(module, qualname)
        except (ImportError, AttributeError) as e:
            problem = f"{module}.{qualname} cannot be imported ({e})"
        else:
            if found is not fn:
                problem = f"{module}.{qualname} names another object"
    if problem is not None:
        raise ConfigError(f"cannot run {fn!r} in a grading process: {problem}")
    return module, qualname  # type: ignore[return-value]


class GraderPool:
    """A zygote and up to ``max_workers`` forked workers (see the module docstring).

    Args:
        max_workers: grades that can run at once (default: the number of CPUs, at least 2).
        memory_mb: address-space limit of each worker (``None``: no limit).
        startup_timeout_s: bound on starting the zygote and on waiting for a free worker.
        preload: modules the zygote imports and warms before it is ready.
    """

    def __init__(
        self,
        *,
        max_workers: int | None = None,
        memory_mb: int | None = 2048,
        startup_timeout_s: float = 120.0,
        preload: Sequence[str] = DEFAULT_PRELOAD,
    ) -> None:
        self.max_workers = max_workers or max(2, os.cpu_count() or 2)
        if self.max_workers < 1:
            raise ConfigError(f"max_workers={max_workers}: must be at least 1")
        self.memory_mb = memory_mb
        self.startup_timeout_s = startup_timeout_s
        self.preload = tuple(preload)
        self._reset_state()
        self._finalizer = weakref.finalize(self, GraderPool._shutdown, self._state)

    def _reset_state(self) -> None:
        self._owner = os.getpid()
        self._cond = threading.Condition()
        self._zlock = threading.Lock()
        self._idle: list[_Worker] = []
        self._workers: set[_Worker] = set()  # every worker not yet discarded
        self._live = 0
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
            workers, self._idle, self._live = list(self._workers), [], 0
            self._workers = set()
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
        parent_end, child_end = socket.socketpair()
        env = {**os.environ, **_SINGLE_THREADED}
        env["AREAL_GRADER_PRELOAD"] = json.dumps(preload)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(child_end.fileno()), json.dumps(sys.path)],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
            )
        except OSError as e:
            parent_end.close()
            raise GraderUnavailable(f"cannot start the grading process: {e}") from e
        finally:
            child_end.close()
        self._state.update(proc=proc, conn=Connection(parent_end.detach()), ready=False)
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
            if pids:
                conn.send(("reap", pids))
            conn.send(request)
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                GraderPool._shutdown(self._state)  # a stuck zygote is replaced
                raise GraderUnavailable("the grading process stopped answering")
            return conn.recv()
        except (EOFError, OSError) as e:
            GraderPool._shutdown(self._state)
            raise GraderUnavailable(f"the grading process died: {e}") from e

    # -- workers

    def _fork(self, deadline: float) -> _Worker:
        with self._zlock:
            for attempt in (1, 2):
                try:
                    _, pid = self._zcall(("fork", self.memory_mb), deadline)
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

    def _acquire(self, deadline: float) -> _Worker:
        with self._cond:
            while True:
                while not self._idle and self._live >= self.max_workers:
                    if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                        raise GraderUnavailable(
                            f"no grading worker became free within {self.startup_timeout_s:g} s "
                            f"({self.max_workers} busy)"
                        )
                if not self._idle:
                    break
                worker = self._idle.pop()
                if not worker.conn.poll(0):  # an idle worker has nothing to say unless it died
                    return worker
                worker.close()
                self._workers.discard(worker)
                self._live -= 1
                self._to_reap.append(worker.pid)
            self._live += 1
        try:
            return self._fork(deadline)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if worker in self._workers:
                self._idle.append(worker)
                self._cond.notify()
                return
        worker.close()  # the pool was closed while it worked

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._cond:
            if worker in self._workers:
                self._workers.discard(worker)
                self._live -= 1
                self._to_reap.append(worker.pid)  # reaped by the zygote with its next request
            self._cond.notify()

    def _prepare(self, worker: _Worker, module: str, deadline: float) -> None:
        if module in worker.modules:
            return
        with self._zlock:
            if module not in self._zmodules:
                reply = self._zcall(("prepare", module), deadline)
                if reply[0] != "ok":
                    raise GraderUnavailable(f"the grading process cannot import {module}: {reply}")
                self._zmodules.add(module)
        worker.conn.send(("prepare", module))
        if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
            raise GraderUnavailable(f"a grading worker did not import {module} in time")
        reply = worker.conn.recv()
        if reply[0] != "ok":
            raise GraderUnavailable(f"a grading worker cannot import {module}: {reply[1]!r}")
        worker.modules.add(module)

    # -- the one public verb

    def run(self, fn: Callable[..., T], *args: Any, timeout_s: float, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker, killed after ``timeout_s`` seconds.

        ``fn`` must be a module-level function (it is imported by name in the worker);
        arguments and result travel by pickle. Raises :class:`RewardTimeout` when the limit
        passes, :class:`GradingFailed` when the worker dies on this input (or runs out of
        memory), :class:`GraderUnavailable` when no worker can be had; any other exception
        raised by ``fn`` is raised here.
        """
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s={timeout_s!r}: must be a positive number of seconds")
        module, qualname = _reference(fn)
        self._check_owner()
        deadline = time.monotonic() + self.startup_timeout_s
        for attempt in (1, 2):
            worker = self._acquire(deadline)
            try:
                self._prepare(worker, module, deadline)
                worker.conn.send(("call", module, qualname, args, kwargs))
            except (EOFError, OSError) as e:  # the idle worker had died: use another one
                self._discard(worker)
                if attempt == 2:
                    raise GraderUnavailable(f"grading workers keep dying: {e}") from e
                continue
            except BaseException:
                self._discard(worker)
                raise
            return self._wait(worker, qualname, timeout_s)
        raise AssertionError("unreachable")

    def _wait(self, worker: _Worker, name: str, timeout_s: float) -> Any:
        try:
            ready = worker.conn.poll(timeout_s)
        except BaseException:
            self._discard(worker)
            raise
        if not ready:
            self._discard(worker)
            raise RewardTimeout(
                f"{name} did not finish within {timeout_s:g} s (the grading process was killed)"
            )
        try:
            reply = worker.conn.recv()
        except (EOFError, OSError):
            self._discard(worker)
            raise GradingFailed(f"the grading process died while running {name}") from None
        except Exception as e:  # the exception it raised does not unpickle here
            self._release(worker)
            raise GradingFailed(f"{name} failed and its error cannot be read: {e!r}") from None
        status, value = reply[0], reply[1]
        if status == "ok":
            self._release(worker)
            return value
        if status == "unpicklable":
            self._release(worker)
            raise GradingFailed(f"{name}: {value} ({reply[2]})")
        if isinstance(value, MemoryError | RecursionError):
            self._discard(worker)  # its heap or stack may be in a bad state
            raise GradingFailed(f"{name} ran out of {_resource(value)} on this input") from None
        if not isinstance(value, Exception):  # SystemExit, KeyboardInterrupt: not ours to raise
            self._discard(worker)
            raise GradingFailed(f"{name} raised {type(value).__name__}: {value}") from None
        self._release(worker)
        raise value


def _resource(error: BaseException) -> str:
    return "memory" if isinstance(error, MemoryError) else "stack (nesting too deep)"


_DEFAULT: GraderPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> GraderPool:
    """The process-wide pool that :func:`run_isolated` uses (created on first use)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = GraderPool()
        return _DEFAULT


def prewarm(*, modules: Sequence[str] = (), wait: bool = False) -> None:
    """Start the default pool's zygote (environments call this on creation, without waiting);
    see :meth:`GraderPool.start`."""
    default_pool().start(modules=modules, wait=wait)


def run_isolated(fn: Callable[..., T], *args: Any, timeout_s: float, **kwargs: Any) -> T:
    """:meth:`GraderPool.run` on the :func:`default_pool`."""
    return default_pool().run(fn, *args, timeout_s=timeout_s, **kwargs)


def _close_default() -> None:
    if _DEFAULT is not None and _DEFAULT._owner == os.getpid():
        _DEFAULT.close()


def _forget_default_after_fork() -> None:
    global _DEFAULT, _DEFAULT_LOCK
    if _DEFAULT is not None:
        _DEFAULT._abandon_after_fork()
    _DEFAULT, _DEFAULT_LOCK = None, threading.Lock()


atexit.register(_close_default)
os.register_at_fork(after_in_child=_forget_default_after_fork)
