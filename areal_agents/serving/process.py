"""One inference server as a child process: start it with a log file, wait for it, stop it.

:class:`ServerProcess` is the lifecycle that the built-in server
(:class:`~areal_agents.serving.server.BuiltinServer`) and stock vLLM
(:class:`~areal_agents.serving.vllm.VLLMServer`) share. A subclass says what to run
(:meth:`ServerProcess.command`, :meth:`ServerProcess.environment`), sets the attributes the
lifecycle reads (``root_url``, ``log_path``, ``process = None``, ``_log = None``) in its
``__init__``, and overrides the class attributes that differ (the name in error messages, the
poll interval, the log file's prefix). The child runs in its own session, so :meth:`stop`
reaches every process it forked (vLLM's engine cores too).

A server on a port it picked itself (:func:`~areal_agents.net.free_port`, the default) that finds
the port taken when it binds (another process took it between the pick and the bind) is
started again on a fresh port by :meth:`ServerProcess.wait_ready`, up to ``port_retries`` times;
read ``base_url`` after :meth:`ServerProcess.wait_ready`. A port the caller named is never
changed: that failure is an error.

A server dies with the process that started it (``die_with_parent``, on by default): on Linux
the child asks the kernel for ``parent_death_signal`` (SIGTERM) when its parent goes
(``PR_SET_PDEATHSIG``, set before exec, with a parent check right after to close the race).
The kernel sends that signal when the *thread* that forked the child ends, so the child is
forked from a small launcher thread that lives as long as the child, and :meth:`start` may be
called from any thread. A server that understands it also gets the parent's pid to watch
(the built-in server's ``--parent-pid``), which covers other platforms and a lost signal.

:func:`send_request` is the HTTP call both servers' weight-sync routes go through: a timeout or
a transport error becomes a :class:`~areal_agents.errors.WeightSyncError` instead of a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, Any, ClassVar, Self

import httpx

from areal_agents.cpus import affinity_hook
from areal_agents.errors import EndpointError, WeightSyncError
from areal_agents.net import free_port

__all__ = ["ServerProcess", "parent_death_hook", "probe_health", "send_request"]

_PR_SET_PDEATHSIG = 1
_PORT_TAKEN = "address already in use"  # EADDRINUSE's text, in uvicorn's and vLLM's logs alike


def parent_death_hook(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``signum`` when this process dies.

    Linux only (``prctl(PR_SET_PDEATHSIG)``, kept across exec); None elsewhere. The hook
    exits the child at once if this process died before the request took effect. The kernel
    ties the signal to the forking *thread*: fork from a thread that outlives the child.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now, not in the forked child
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os._exit(1)

    return hook


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
    status_timeout_s: ClassVar[float] = 60.0
    """Time limit of a status read (the weight version): a server generating for dozens of
    episodes on one CPU core answered ``/weight_info`` only after more than 10 s."""
    """Whether the not-ready-in-time error carries the end of the log."""
    parent_death_signal: ClassVar[int] = signal.SIGTERM
    """What the child receives when the process that started it dies."""

    host: str
    port: int
    base_url: str
    root_url: str
    log_path: Path | None
    process: subprocess.Popen[bytes] | None
    _log: IO[bytes] | None
    die_with_parent: bool = True
    """End the server when this process dies (see the module docstring)."""
    extra_env: Mapping[str, str] = MappingProxyType({})
    """Variables set in the child on top of :meth:`environment` (e.g. ``OMP_NUM_THREADS``)."""
    cpus: tuple[int, ...] | None = None
    """CPU cores the server, and every process it starts, runs on (Linux; None: all)."""
    port_chosen: bool = False
    """Whether the port came from :func:`~areal_agents.net.free_port` (the subclass sets it when
    it was given none): only such a port is replaced when it turns out to be taken."""
    port_retries: ClassVar[int] = 3
    """Fresh ports :meth:`wait_ready` tries after the chosen one was taken before the bind."""
    _release: threading.Event | None = None
    _log_start: int = 0

    def command(self) -> list[str]:
        """The command line that starts the server."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The child's environment: this one, with the Hugging Face hub kept offline."""
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def preexec_fn(self) -> Callable[[], None] | None:
        """What the child runs before exec: its move onto :attr:`cpus`, then
        :func:`parent_death_hook` if ``die_with_parent``."""
        death = parent_death_hook(self.parent_death_signal) if self.die_with_parent else None
        return affinity_hook(self.cpus, death)

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
        self._log_start = self.log_path.stat().st_size  # this start's lines begin here
        command, env, log = self.command(), {**self.environment(), **self.extra_env}, self._log
        preexec_fn = self.preexec_fn()

        def launch() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )

        self.process = launch() if preexec_fn is None else self._launch_in_thread(launch)
        return self

    def _launch_in_thread(
        self, launch: Callable[[], subprocess.Popen[bytes]]
    ) -> subprocess.Popen[bytes]:
        """Run ``launch`` in a daemon thread that stays alive until the child ends or :meth:`stop`.

        ``PR_SET_PDEATHSIG`` fires when the forking thread ends; forking from the caller's
        thread would kill the server as soon as, say, a worker thread that started it returned.
        """
        box: list[subprocess.Popen[bytes] | BaseException] = []
        ready = threading.Event()
        release = self._release = threading.Event()

        def run() -> None:
            try:
                process = launch()
            except BaseException as e:  # handed to the caller below
                box.append(e)
                ready.set()
                return
            box.append(process)
            ready.set()
            while not release.wait(1.0) and process.poll() is None:
                pass

        threading.Thread(target=run, name=f"{self.log_prefix}launcher", daemon=True).start()
        ready.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def terminate(self) -> None:
        """Send SIGTERM to the server's process group and return at once (:meth:`stop` waits).

        Safe in a signal handler: it neither waits nor reaps.
        """
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log (for error messages)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def pick_port(self, port: int) -> None:
        """Serve on ``port`` on :attr:`host`; 0 picks a free one
        (:func:`~areal_agents.net.free_port`), which :meth:`wait_ready` may replace if it is
        taken before the bind."""
        self.port_chosen = not port
        self.use_port(port or free_port())

    def use_port(self, port: int) -> None:
        """Serve on ``port`` from the next :meth:`start` on: ``port``, ``base_url`` and
        ``root_url`` change together."""
        self.port = port
        self.root_url = f"http://{self.host}:{port}"
        self.base_url = f"{self.root_url}/v1"

    def port_was_taken(self) -> bool:
        """Whether the last start's log says the port was in use when the server bound it."""
        if self.log_path is None or not self.log_path.exists():
            return False
        with self.log_path.open("rb") as f:
            f.seek(self._log_start)
            return _PORT_TAKEN in f.read().decode(errors="replace").lower()

    def is_healthy(self) -> bool:
        """Whether ``/health`` answers 200 now."""
        return probe_health(self.root_url)

    def wait_ready(self, timeout: float = 180.0) -> Self:
        """Block until ``/health`` answers; raise :class:`EndpointError` if it dies or times out.

        A server that died because its chosen port was taken (:attr:`port_chosen`) is started
        again on a fresh port, within the same ``timeout``.
        """
        if self.process is None:
            self.start()
        assert self.process is not None
        deadline = time.monotonic() + timeout
        retries = self.port_retries if self.port_chosen else 0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if retries > 0 and self.port_was_taken():
                    retries -= 1
                    taken = self.port
                    self.stop()
                    self.use_port(free_port(self.host))
                    log_line = f"[areal] port {taken} was taken; starting again on {self.port}\n"
                    if self.log_path is not None:
                        with self.log_path.open("a") as f:
                            f.write(log_line)
                    self.start()
                    continue
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
        """Terminate the server process group: SIGTERM, wait ``timeout`` s, then SIGKILL.

        Only the group this object started is signalled (the child leads its own session);
        members that outlive the leader (engine processes) are killed right after it exits.
        """
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=timeout)
            # Reaped just now, so the group id cannot have been reused yet.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._release is not None:
            self._release.set()
            self._release = None
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
