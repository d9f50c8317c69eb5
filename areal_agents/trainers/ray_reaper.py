"""No Ray process outlives the run that started it, even after ``kill -9`` of the driver.

Ray ties the processes a local ``ray.init`` starts (GCS, raylet, monitors) to the driver with
``PR_SET_PDEATHSIG``, and workers exit when their raylet goes, but the agents the raylet starts
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) were measured alive 30 s after a
``kill -9`` of the trainer, blocked reporting the raylet's death to a GCS that is gone. So a
local run is watched by a reaper: a tiny stdlib-only process, started before Ray in its own
session (a signal to the trainer's process group does not reach it), that waits on a pipe
only the driver holds. When the pipe ends — the driver exited or was killed — the reaper
waits for the driver to be gone, then kills with SIGKILL every process of the run, and exits:

* every process whose environment carries ``AREAL_RAY_RUN=<token>`` (set for ``ray.init`` only,
  so Ray's processes and their children inherit it, and nothing else the driver starts), and
* every process holding a file open in the run's Ray session directory (Ray redirects the
  output of all its processes there, and a worker's children inherit it) — Ray rewrites the
  command line of its agents and workers over their environment, so the environment alone
  is not enough.

The driver itself and the reaper are spared. Once nothing is left, the reaper removes the run's
session directory (and Ray's ``session_latest`` link when it names it): a local run leaves no
logs or sockets behind under Ray's temp directory. Before a second ``ray.init`` in the same process,
the previous run's reaper is told to sweep at once (:meth:`RayReaper.sweep_now`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

__all__ = ["RUN_ENV", "RayReaper"]

RUN_ENV = "AREAL_RAY_RUN"
"""The environment variable that marks the processes of one Ray run."""


class RayReaper:
    """The driver's handle on its reaper process (see the module docstring)."""

    def __init__(self, token: str, process: subprocess.Popen[bytes]) -> None:
        self.token = token
        self.process = process

    @classmethod
    def start(cls) -> RayReaper:
        """Start a reaper for this process; set ``RUN_ENV`` to :attr:`token` around ``ray.init``."""
        token = f"{os.getpid()}-{uuid.uuid4().hex[:16]}"
        env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), token, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # out of the driver's process group: it must outlive it
        )
        return cls(token, process)

    def watch(self, session_dir: str) -> None:
        """Also reap every process with a file open under Ray's ``session_dir``."""
        self._send(f"session {os.path.realpath(session_dir)}\n")

    def sweep_now(self, timeout: float = 10.0) -> None:
        """Reap the run's processes now (the driver stays) and wait for the reaper to finish."""
        self._send("sweep\n")
        self.close()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        """End the pipe: the reaper reaps once this process has exited."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):  # the reaper already gone
                stdin.close()

    def _send(self, line: str) -> None:
        stdin = self.process.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write(line.encode())
            stdin.flush()
        except OSError:  # the reaper is gone: nothing to tell it
            pass


# ---- the reaper process (stdlib only: it runs by path, without the package) --------------


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (None: no such process, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else fields[19].decode()


def _belongs(pid: int, marker: bytes, session: str | None) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if marker in f.read().split(b"\0"):
                return True
    except OSError:
        pass
    if session is None:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target == session or target.startswith(session + "/"):
            return True
    return False


def sweep(token: str, session: str | None, spare: set[int]) -> list[int]:
    """SIGKILL every live process of the run except ``spare``; the pids killed."""
    marker = f"{RUN_ENV}={token}".encode()
    killed: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spare or _start_time(int(name)) is None:
            continue
        if _belongs(int(name), marker, session):
            try:
                os.kill(int(name), signal.SIGKILL)
                killed.append(int(name))
            except OSError:
                pass
    return killed


def _main(token: str, driver: int) -> None:
    driver_start = _start_time(driver)
    session: str | None = None
    now = False
    for raw in sys.stdin.buffer:  # blocks until the driver writes or its end of the pipe closes
        line = raw.decode(errors="replace").strip()
        if line.startswith("session "):
            session = line.removeprefix("session ")
        elif line == "sweep":
            now = True
            break
    if not now:  # the driver exited or was killed: let it finish going (atexit, Ray's own)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and _start_time(driver) == driver_start:
            time.sleep(0.1)
    spare = {os.getpid(), driver}
    for _ in range(10):  # a dying raylet may still start a worker: sweep until nothing is left
        if not sweep(token, session, spare):
            break
        time.sleep(0.3)
    if session is not None:
        remove_session(session)


def remove_session(session: str) -> None:
    """Delete Ray's session directory ``session`` and the ``session_latest`` link naming it."""
    if not os.path.basename(session).startswith("session_"):
        return  # not a Ray session directory: never delete what we did not expect
    latest = os.path.join(os.path.dirname(session), "session_latest")
    with contextlib.suppress(OSError):
        if os.path.islink(latest) and os.path.realpath(latest) == session:
            os.unlink(latest)
    shutil.rmtree(session, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is for the driver
    _main(sys.argv[1], int(sys.argv[2]))
