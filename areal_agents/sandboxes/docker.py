"""The docker backend: one long-lived container per episode, taken from a warm pool.

Containers run with no network, a memory limit equal to the memory+swap limit, a pids limit, a
CPU quota, a read-only root with tmpfs ``/work`` and ``/tmp`` (their size is the disk limit) and
``no-new-privileges``. Programs run as uid 65534 with no capabilities at all; the container's
own processes run as its root, which holds only ``KILL``, ``SETUID``, ``SETGID`` and
``SYS_CHROOT`` (to supervise and to drop to uid 65534) and which a program can neither signal,
nor stop, nor trace, nor read the memory or environment of.

**Exit status that a program cannot forge.** Every call is one ``docker exec`` of a small root
shell (``_docker_exec.WRAPPER``) that (1) runs the program as uid 65534 under ``timeout -s KILL``
*inside* the container (killing an exec client leaves the program running), (2) then sends
SIGKILL to every process of uid 65534 until none is left, (3) reads the cgroup's ``oom_kill``
counter before and after, and (4) prints one status line: a marker, the exit code, OOM kills
and survivors, and exits with the program's exit code. The host believes that line only when
all of these hold, each outside the program's reach:

* the marker is a fresh secret per call, passed in the root shell's environment and unset
  before the program starts: root's ``/proc/PID/environ`` and memory are closed to uid 65534,
  so no program can print a valid line (the review's forgery read it from ``cmdline``);
* the stream *ends* with that line, and the exit code the engine recorded for the exec
  (``exec_inspect``) equals the code in it: the wrapper ran to its last line;
* no survivors.

Anything else (the wrapper was OOM-killed, the stream did not end ``_GRACE_S`` after the time
limit, the line is missing or inconsistent, something survived) and the host kills the whole
container through the engine before the call returns, so nothing of the program outlives the
call; it reports the exit code the engine recorded for the exec (137 when there is none),
``timed_out`` when the limit had passed, a note on stderr, and takes a fresh container from
the pool for the next call. As root's ``timeout`` and sweep cannot be stopped, a
program that stops every process it may signal (``kill(-1, SIGSTOP)``) still ends on time.

File operations run as uid 65534 and follow the rules every backend shares (``_inputs``): a
path may not lead out of ``/work`` through a symlink, and FIFOs and special files are refused
before anything opens them. Output is read from the exec socket frame by frame and capped as it
arrives.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from typing import Any

from areal_agents.errors import SandboxError, ToolError
from areal_agents.sandboxes._docker_exec import (
    ROOT_USER,
    STATUS_VAR,
    WRAPPER,
    _Exec,
    parse_status,
    reset_container,
)
from areal_agents.sandboxes._inputs import (
    CommandRunner,
    encode_data,
    problem,
    work_relpath,
)
from areal_agents.sandboxes.base import BaseSandbox, ExecResult, SandboxLimits
from areal_agents.sandboxes.docker_pool import get_pool
from areal_agents.sandboxes.image import default_image

__all__ = ["DockerSandbox", "docker_problem", "reset_container"]

log = logging.getLogger(__name__)

_GRACE_S = 5.0  # how long past the time limit the supervisor may take before the host steps in
_FILE_OP_S = 60.0  # a file operation cannot block (special files are refused), so this is a fault
_KILLED_NOTE = b"\n[sandbox: the run did not end normally; its container was killed]\n"

# $1: the file, as /work/RELATIVE. Resolve symlinks (only when a component is one: realpath is a
# process), then: 10 outside /work, 11 /work itself, 12 missing, 13 not a regular file.
_RESOLVE = r"""
p=$1; r=$p
IFS=/; set -f; q=
for c in ${p#/work/}; do
  q=$q/$c
  if [ -L "/work$q" ]; then r=$(realpath -m -- "$p") || exit 20; break; fi
done
unset IFS; set +f
case $r in /work) exit 11;; /work/*) ;; *) exit 10;; esac
"""
_READ = (
    _RESOLVE
    + r"""
[ -e "$r" ] || exit 12
[ -f "$r" ] || exit 13
exec cat -- "$r"
"""
)
# ... and 14: a parent is not a directory, 15: the write failed (no space, ...).
_WRITE = (
    _RESOLVE
    + r"""
if [ -e "$r" ]; then [ -f "$r" ] || exit 13; fi
[ -d "${r%/*}" ] || mkdir -p -- "${r%/*}" 2>/dev/null || exit 14
cat > "$r" || { rm -f -- "$r"; exit 15; }
"""
)
_FILE_CODES = {10: "outside", 11: "workdir", 12: "missing", 13: "irregular", 14: "notdir"}


def docker_problem(image: str | None = None) -> str | None:
    """None when a Docker engine answers and the sandbox image exists, else the reason."""
    try:
        import docker
        import docker.errors
    except ImportError:
        return "the docker SDK is not installed (pip install docker)"
    image = image or default_image()
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as e:
        return f"no Docker engine answers ({type(e).__name__}: {e})"
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"image {image} is missing: python -m areal_agents.sandbox build"
    except Exception as e:
        return f"cannot look up image {image}: {e}"
    finally:
        client.close()
    return None


class DockerSandbox(CommandRunner, BaseSandbox):
    """A container held for one episode; :meth:`close` gives it back to the warm pool.

    Get one with ``make_sandbox("docker", ...)`` or :meth:`acquire`.
    """

    backend = "docker"
    work_path = "/work"

    def __init__(self, pool: Any, container: Any, limits: SandboxLimits) -> None:
        self._pool = pool
        self._container = container
        self.limits = limits
        self._lock = threading.Lock()
        self._tainted = False
        self._closed = False
        self._exec = _Exec(pool.client, container.id)

    @classmethod
    def acquire(
        cls,
        limits: SandboxLimits | None = None,
        *,
        image: str | None = None,
        pool_size: int | None = None,
    ) -> DockerSandbox:
        """A sandbox from the process's warm pool for ``(image, limits)``."""
        limits = limits or SandboxLimits()
        if pool_size is None:
            pool_size = int(os.environ.get("AREAL_SANDBOX_POOL_SIZE", "2"))
        pool = get_pool(image or default_image(), limits, pool_size)
        return cls(pool, pool.acquire(), limits)

    @property
    def container_id(self) -> str:
        """The id of the container currently behind this sandbox."""
        return str(self._container.id)

    # --- the Sandbox contract ---------------------------------------------------------------

    def write_file(self, path: str, content: str | bytes) -> None:
        data = encode_data(content)
        if len(data) > self.limits.disk_mb * 2**20:
            limit = self.limits.disk_mb
            raise ToolError(f"file of {len(data)} bytes exceeds the sandbox's {limit} MB")
        err, code = self._file_op(_WRITE, path, data, 4096)[1:]
        if code == 15 and b"No space left" in err:
            raise problem("space", path)
        if code != 0:
            raise self._file_error(path, code, err, "write")

    def read_file(self, path: str) -> bytes:
        out, err, code = self._file_op(_READ, path, None, self.limits.disk_mb * 2**20)
        if code != 0:
            raise self._file_error(path, code, err, "read")
        return out

    def reset(self) -> None:
        with self._lock:
            self._ready()
            if not reset_container(self._pool.client, self.container_id):
                self._replace()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pool.release(self._container, reusable=not self._tainted)

    # --- helpers ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("docker sandbox is closed")

    def _ready(self) -> None:
        self._check_open()
        if self._tainted:
            self._replace()

    def _replace(self) -> None:
        """Swap in a fresh container (the old one had survivors or could not be reset)."""
        log.warning("replacing sandbox container %s", self.container_id[:12])
        self._pool.release(self._container, reusable=False)
        self._container = self._pool.acquire()
        self._exec = _Exec(self._pool.client, self._container.id)
        self._tainted = False

    def _end_container(self) -> None:
        """Kill every process of the container now (through the engine); replace it later."""
        self._tainted = True
        try:
            self._container.kill()
        except Exception as e:  # already gone: nothing of it runs either
            log.info("killing sandbox container %s: %s", self.container_id[:12], e)

    def _file_op(
        self, script: str, path: str, stdin: bytes | None, cap: int
    ) -> tuple[bytes, bytes, int]:
        target = "/work/" + work_relpath(path, self.work_path)
        with self._lock:
            self._ready()
            out, err, _, code, _ = self._exec(
                ["/bin/sh", "-c", script, "sh", target],
                stdin=stdin,
                deadline=time.monotonic() + _FILE_OP_S,
                caps=(cap, 4096),
            )
            if code is None:
                self._end_container()
                raise SandboxError(f"a file operation on {path!r} did not finish in the sandbox")
        return out, err, code

    @staticmethod
    def _file_error(path: str, code: int, err: bytes, verb: str) -> ToolError:
        kind = _FILE_CODES.get(code)
        if kind is not None:
            return problem(kind, path)
        msg = err.decode(errors="replace").strip().splitlines()
        return ToolError(f"cannot {verb} {path!r}: {msg[-1] if msg else f'exit code {code}'}")

    def _python(self) -> str:
        return "python3"

    def _run_argv(self, argv: list[str], timeout: float, stdin: bytes | None) -> ExecResult:
        if not timeout > 0:
            raise ValueError(f"timeout={timeout} must be positive")
        cap = self.limits.max_output_bytes
        mark = "__areal_status_" + secrets.token_hex(16)
        with self._lock:
            self._ready()
            start = time.monotonic()
            out, err, totals, code, tail = self._exec(
                ["/bin/sh", "-c", WRAPPER, "sh", f"{timeout:.3f}", *argv],
                stdin=stdin,
                deadline=start + timeout + _GRACE_S,
                caps=(cap, cap + 256),
                user=ROOT_USER,
                env={STATUS_VAR: mark},
            )
            duration = time.monotonic() - start
            parsed = parse_status(tail, mark)
            trusted = parsed is not None and parsed[0][0] == code and parsed[0][2] == 0
            if not trusted:  # see the module docstring: nothing of this run may outlive it
                self._end_container()
        if parsed is not None and trusted:
            (rc, oom, _), status_len = parsed
            err_len = totals[1] - status_len  # the program's own stderr, without the status
            err = err[: max(0, min(err_len, cap))]
            timed_out = rc == 137 and oom == 0 and duration >= timeout * 0.95
        else:
            rc, oom = (code if code is not None else 137), 0
            err_len = totals[1]
            err = (
                err[:cap] + b"\n[sandbox: the run did not end normally; its container was killed]\n"
            )
            timed_out = code is None or duration >= timeout
        return ExecResult(
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            exit_code=rc,
            timed_out=timed_out,
            oom_killed=oom > 0,
            truncated=totals[0] > cap or err_len > cap,
            duration_s=duration,
        )
