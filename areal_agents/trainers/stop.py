"""Stopping on SIGTERM or SIGINT (Ctrl-C) without losing the training done so far.

Before the loop starts (Ray, servers and learners coming up) a signal unwinds at once, as an
exception: there is nothing to save yet. Once :meth:`GracefulStop.arm` is called, the first
signal only records the request: the loop finishes the step in progress, saves a checkpoint
and exits with ``128 + signal`` (a re-run resumes from that checkpoint). A second signal
unwinds at once, as before (the last checkpoint on disk is still whole: checkpoints are
committed by rename). The time budget's rules (:func:`rl_budget_s`,
:func:`latest_step_start`, :func:`over`) decide when the loop stops starting steps.

>>> import os, signal
>>> stop = GracefulStop()
>>> stop.install()
>>> stop.arm()
>>> os.kill(os.getpid(), signal.SIGTERM)
>>> stop.requested, stop.exit_code
(True, 143)
>>> stop.uninstall()
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType
from typing import Any

__all__ = ["GracefulStop", "StartupClock", "latest_step_start", "over", "rl_budget_s"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """A SIGTERM/SIGINT handler that turns the first signal into a stop request once armed."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a signal asked the run to stop (after :meth:`arm`)."""
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        """The exit status of a run stopped by signal ``signum``: ``128 + signum``."""
        return 128 + (self.signum or 0)

    @property
    def name(self) -> str:
        """The signal's name (``SIGTERM``), or an empty string."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def install(self) -> None:
        """Take over SIGTERM and SIGINT (main thread only; call after ``ray.init``, which
        installs its own SIGTERM handler)."""
        for sig in _SIGNALS:  # installing again (after ray.init) keeps the first previous
            self._previous.setdefault(sig, signal.signal(sig, self._handle))

    def uninstall(self) -> None:
        """Give the signals back to the handlers found by :meth:`install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def arm(self) -> None:
        """From now on the first signal is a stop request, not an exception."""
        self.armed = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.armed or self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signum = signum
        print(
            f"\n{signal.Signals(signum).name}: stopping after this step and saving a checkpoint "
            "(send it again to quit at once; a re-run resumes from the last checkpoint)",
            file=sys.stderr,
            flush=True,
        )


class StartupClock:
    """How long the command took to train its first step, measured from the start of Python's
    work in this process: the first import of ``areal_agents``
    (:data:`areal_agents.IMPORTED_AT`), which a command line does before anything else.

    Not the process's creation: ``scripts/train.sh`` ``exec``s Python from the shell that ran
    the install, so the process is as old as the install (a fresh clone's run once read
    ``imports_s: 252.9``). The interpreter's own start-up before the package import (tens of
    milliseconds) is not counted.

    :meth:`mark` closes a phase (seconds since the previous mark); :meth:`summary` gives
    ``time_to_first_step_s`` (from that start, Python's imports included, to the end of the
    first optimizer step) and ``startup`` (the phases).

    >>> clock = StartupClock()
    >>> clock.mark("ray_s")
    >>> clock.first_step_done()
    >>> s = clock.summary()
    >>> list(s["startup"]), s["time_to_first_step_s"] >= s["startup"]["ray_s"] >= 0
    (['imports_s', 'ray_s'], True)
    """

    def __init__(self) -> None:
        self.process_start = _process_start()
        self.phases: dict[str, float] = {}
        self._last = time.time()
        self.imports_s = round(self._last - self.process_start, 3)
        self.first_step_at: float | None = None

    def mark(self, phase: str) -> None:
        """End ``phase`` now."""
        now = time.time()
        self.phases[phase] = round(now - self._last, 3)
        self._last = now

    def first_step_done(self) -> None:
        """The first optimizer step of this invocation has finished."""
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def summary(self) -> dict[str, object]:
        """``time_to_first_step_s`` (None if no step ran) and the ``startup`` phases, the first
        of them ``imports_s`` (the package's first import to the clock's creation)."""
        first = self.first_step_at
        return {
            "time_to_first_step_s": None if first is None else round(first - self.process_start, 3),
            "startup": {"imports_s": self.imports_s, **self.phases},
        }


def _process_start() -> float:
    """When Python's work in this process started: the package's first import (wall clock)."""
    import areal_agents

    return areal_agents.IMPORTED_AT


# ---- the time budget: when the loop may start a step -------------------------------------


def rl_budget_s(budget: float | None, warm_start_s: float) -> float | None:
    """RL's share of ``trainer.time_budget_s``: what the warm start left of it (None: none).

    >>> rl_budget_s(1200.0, 150.0), rl_budget_s(100.0, 150.0), rl_budget_s(None, 150.0)
    (1050.0, 0.0, None)
    """
    return None if budget is None else max(0.0, budget - warm_start_s)


def latest_step_start(deadline: float | None, longest_step_s: float) -> float | None:
    """The last moment a step may start (take its batch) and still end by ``deadline``,
    judged by the longest step so far (0 before the first); None: no deadline.

    >>> latest_step_start(1000.0, 0.0), latest_step_start(1000.0, 107.5), latest_step_start(None, 9)
    (1000.0, 892.5, None)
    """
    return None if deadline is None else deadline - longest_step_s


def over(deadline: float | None) -> bool:
    """Whether the ``time.perf_counter()`` deadline (None: none) has passed."""
    return deadline is not None and time.perf_counter() >= deadline
