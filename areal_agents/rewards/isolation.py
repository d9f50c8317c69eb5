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

Where the parts live: :mod:`._pool` holds :class:`GraderPool` (the caller's side: starting the
zygote, forking and killing workers, the time limits, one grade's :class:`GradingSession`),
:mod:`._protocol` the wire between them (launching the zygote with a scrubbed environment, a
job's name, the allow-listed unpickling of a reply), :mod:`._grader` the zygote and the workers
themselves, and :mod:`._confine` what a worker gives up before it reads its job (its own uid,
no capabilities, no new privileges, a seccomp filter, limits, an empty directory it cannot
write to).

>>> run_isolated(pow, 2, 10, timeout_s=30)
1024
>>> run_isolated(pow, 9, 9**9, timeout_s=0.5)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
areal_agents.errors.RewardTimeout: pow did not finish within 0.5 s (the grading ...
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from areal_agents.rewards._grader import warm_up
from areal_agents.rewards._pool import GraderPool, GradingSession
from areal_agents.rewards._protocol import DEFAULT_PRELOAD, GraderUnavailable, GradingFailed
from areal_agents.rewards._protocol import MAX_REPLY_BYTES as MAX_REPLY_BYTES

__all__ = [
    "GraderPool",
    "GraderUnavailable",
    "GradingFailed",
    "GradingSession",
    "default_pool",
    "named_pool",
    "prewarm",
    "run_isolated",
    "warm_up",
]

T = TypeVar("T")


_POOLS: dict[str, GraderPool] = {}
_POOLS_LOCK = threading.Lock()


def named_pool(name: str, *, preload: Sequence[str] = DEFAULT_PRELOAD) -> GraderPool:
    """The process-wide pool called ``name``, created on first use with ``preload``.

    Graders of different kinds use different pools, so that each zygote holds only what its
    graders import: a fork (one per grade) and a worker's exit cost in proportion to it
    (the unit-test judge's zygote is half the size of math-verify's)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            pool = _POOLS[name] = GraderPool(preload=preload)
        return pool


def default_pool() -> GraderPool:
    """The process-wide pool that :func:`run_isolated` uses (created on first use)."""
    return named_pool("default")


def prewarm(*, modules: Sequence[str] = (), wait: bool = False) -> None:
    """Start the default pool's zygote (environments call this on creation, without waiting);
    see :meth:`GraderPool.start`."""
    default_pool().start(modules=modules, wait=wait)


def run_isolated(fn: Callable[..., T], *args: Any, timeout_s: float, **kwargs: Any) -> T:
    """:meth:`GraderPool.run` on the :func:`default_pool`."""
    return default_pool().run(fn, *args, timeout_s=timeout_s, **kwargs)


def _close_pools() -> None:
    for pool in list(_POOLS.values()):
        if pool._owner == os.getpid():
            pool.close()


def _forget_pools_after_fork() -> None:
    global _POOLS_LOCK
    for pool in list(_POOLS.values()):
        pool._abandon_after_fork()
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


atexit.register(_close_pools)
os.register_at_fork(after_in_child=_forget_pools_after_fork)
