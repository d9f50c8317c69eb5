"""Stopping on SIGTERM or SIGINT (Ctrl-C) without losing the training done so far.

Before the loop starts (Ray, servers and learners coming up) a signal unwinds at once, as an
exception: there is nothing to save yet. Once :meth:`GracefulStop.arm` is called, the first
signal only records the request: the loop finishes the step in progress, saves a checkpoint
and exits with ``128 + signal`` (a re-run resumes from that checkpoint). A second signal
unwinds at once, as before (the last checkpoint on disk is still whole: checkpoints are
committed by rename).

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
from types import FrameType
from typing import Any

__all__ = ["GracefulStop"]

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
        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

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
