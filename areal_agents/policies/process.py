"""One inference server as a child process: start it with a log file, wait for it, stop it.

:class:`ServerProcess` is the lifecycle that the built-in server
(:class:`~areal_agents.policies.server.BuiltinServer`) and stock vLLM
(:class:`~areal_agents.policies.vllm.VLLMServer`) share. A subclass says what to run
(:meth:`ServerProcess.command`, :meth:`ServerProcess.environment`), sets the attributes the
lifecycle reads (``root_url``, ``log_path``, ``process = None``, ``_log = None``) in its
``__init__``, and overrides the class attributes that differ (the name in error messages, the
poll interval, the log file's prefix). The child runs in its own session, so :meth:`stop`
reaches every process it forked (vLLM's engine cores too).

:func:`send_request` is the HTTP call both servers' weight-sync routes go through: a timeout or
a transport error becomes a :class:`~areal_agents.errors.WeightSyncError` instead of a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Self

import httpx

from areal_agents.errors import EndpointError, WeightSyncError

__all__ = ["ServerProcess", "free_port", "probe_health", "send_request"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe_health(root_url: str) -> bool:
    """Whether ``{root_url}/health`` answers 200 within 2 s."""
    try:
        return httpx.get(f"{root_url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def send_request(
    method: str, root_url: str, route: str, timeout: float, *, label: str = "", **kwargs: Any
) -> httpx.Response:
    """``method`` on ``{root_url}{route}``; the response whatever its status.

    A timeout or transport error raises :class:`~areal_agents.errors.WeightSyncError` whose
    message starts with ``label`` (``"vLLM "``) and the route. ``kwargs`` go to httpx
    (``json``, ``params``, ``content``, ``headers``).
    """
    try:
        return httpx.request(method, f"{root_url}{route}", timeout=timeout, **kwargs)
    except httpx.TimeoutException:
        raise WeightSyncError(f"{label}{route} did not answer within {timeout:.0f} s") from None
    except httpx.HTTPError as e:
        raise WeightSyncError(f"{label}{route} failed: {type(e).__name__}: {e}") from None


class ServerProcess:
    """The start / wait / stop lifecycle of a server child process (a base class).

    Subclasses implement :meth:`command` and may extend :meth:`environment`. The defaults of
    :meth:`log_tail`, :meth:`wait_ready` and :meth:`stop` suit a server that starts in seconds;
    a slower one overrides them with its own defaults.
    """

    display_name: ClassVar[str] = "the server"
    """How error messages name the server (``"vLLM"``)."""
    poll_interval_s: ClassVar[float] = 0.25
    """Seconds between ``/health`` probes in :meth:`wait_ready`."""
    log_prefix: ClassVar[str] = "areal-server-"
    """Prefix of the temporary log file made when no ``log_path`` is given."""
    log_tail_on_timeout: ClassVar[bool] = False
    """Whether the not-ready-in-time error carries the end of the log."""

    root_url: str
    log_path: Path | None
    process: subprocess.Popen[bytes] | None
    _log: IO[bytes] | None

    def command(self) -> list[str]:
        """The command line that starts the server."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The child's environment: this one, with the Hugging Face hub kept offline."""
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def preexec_fn(self) -> Callable[[], None] | None:
        """What the child runs before exec (None: nothing)."""
        return None

    def start(self) -> Self:
        """Start the server process (returns at once; see :meth:`wait_ready`)."""
        if self.process is not None:
            return self
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=self.log_prefix, suffix=".log")
            self._log = os.fdopen(fd, "ab")
            self.log_path = Path(name)
        else:
            self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,
            preexec_fn=self.preexec_fn(),
        )
        return self

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log (for error messages)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def is_healthy(self) -> bool:
        """Whether ``/health`` answers 200 now."""
        return probe_health(self.root_url)

    def wait_ready(self, timeout: float = 180.0) -> Self:
        """Block until ``/health`` answers; raise :class:`EndpointError` if it dies or times out."""
        if self.process is None:
            self.start()
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EndpointError(
                    f"{self.display_name} exited with code {self.process.returncode}:\n"
                    + self.log_tail()
                )
            if self.is_healthy():
                return self
            time.sleep(self.poll_interval_s)
        self.stop()
        message = f"{self.display_name} was not ready within {timeout:.0f} s"
        if self.log_tail_on_timeout:
            message += f":\n{self.log_tail()}"
        raise EndpointError(message)

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate the server process group (SIGTERM, then SIGKILL)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
