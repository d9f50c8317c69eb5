"""The docker backend: one long-lived container per episode, taken from a warm pool.

Containers run with no network, a memory limit equal to the memory+swap limit, a pids limit, a
CPU quota, a read-only root with tmpfs ``/work`` and ``/tmp`` (their size is the disk limit), all
capabilities dropped and ``no-new-privileges``; programs run as uid 65534, which cannot signal
the container's main process (uid 65533).

Every call is one ``docker exec`` of a small shell wrapper that (1) runs the program under
``timeout -s KILL`` *inside* the container, since killing an exec client leaves the program
running, (2) kills every process of the sandbox user afterwards, so background processes never
outlive the call, (3) reads the cgroup's ``oom_kill`` counter before and after, and (4) counts
processes that survived the kill. A container with survivors is replaced before the next call.
Output is read from the exec socket frame by frame and capped as it arrives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import secrets
import socket
import struct
import threading
import time
from typing import Any

from areal_agents.errors import SandboxError, ToolError
from areal_agents.sandboxes.base import BaseSandbox, ExecResult, SandboxLimits
from areal_agents.sandboxes.docker_pool import SANDBOX_USER, get_pool
from areal_agents.sandboxes.image import default_image

__all__ = ["DockerSandbox", "docker_problem", "reset_container"]

log = logging.getLogger(__name__)

_MARK = "__areal_status_" + secrets.token_hex(6)
_GRACE_S = 15.0  # how long past the time limit the exec stream may take to end
_STDIN_CODE_LIMIT = 100_000
_ENV = {"HOME": "/work", "TMPDIR": "/tmp", "PYTHONUNBUFFERED": "1"}

# Shell functions both scripts use. oom: the cgroup's oom_kill counter into $n (v1 or v2).
# live: into $s, how many processes of the sandbox user, other than this shell, are not dead.
_FUNCS = r"""
oom() { n=0
  for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
    [ -r "$f" ] || continue
    while read -r k v; do [ "$k" = oom_kill ] && n=$v; done < "$f"
  done; }
live() { s=0
  for d in /proc/[0-9]*; do
    [ -O "$d" ] && [ "${d#/proc/}" != "$$" ] || continue
    read -r x < "$d/stat" 2>/dev/null || continue
    case "$x" in *") Z "*|*") X "*) ;; *) s=$((s+1));; esac
  done; }
killall() { kill -9 -1 2>/dev/null; live
  for _ in 1 2 3 4 5; do [ $s = 0 ] && break; sleep 0.02; kill -9 -1 2>/dev/null; live; done; }
"""

# $1: time limit, $2: status marker, then the program's argv. After the program only shell
# built-ins run (no fork), except `sleep` while a killed process is still dying.
_WRAPPER = (
    _FUNCS
    + r"""
t=$1; m=$2; shift 2
oom; o=$n
timeout -s KILL "$t" "$@"
rc=$?
killall
oom
printf '\n%s %s %s %s\n' "$m" "$rc" "$((n-o))" "$s" >&2
exit $rc
"""
)

# Between episodes: kill, empty the writable places, then print what is left: files, live
# processes, System V IPC objects. Anything but "0 0 0" means the container is replaced.
_RESET = (
    _FUNCS
    + r"""
killall
f=0
for d in /work /tmp /dev/shm; do
  chmod -R u+rwx "$d" 2>/dev/null
  find "$d" -mindepth 1 -delete 2>/dev/null
  for p in "$d"/* "$d"/.[!.]* "$d"/..?*; do [ -e "$p" ] || [ -L "$p" ] && f=$((f+1)); done
done
i=0
for k in shm msg sem; do
  j=0; while read -r line; do j=$((j+1)); done < /proc/sysvipc/$k; i=$((i+j-1))
done
echo "$f $s $i"
"""
)


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


class _Exec:
    """One ``docker exec`` over a hijacked socket: stdin in, multiplexed frames out, capped."""

    def __init__(self, client: Any, container_id: str) -> None:
        self.api = client.api
        self.cid = container_id

    def __call__(
        self,
        argv: list[str],
        *,
        stdin: bytes | None,
        deadline: float,
        caps: tuple[int, int],
        user: str = SANDBOX_USER,
    ) -> tuple[bytes, bytes, tuple[int, int], int | None, bytes]:
        """Run ``argv``: stdout and stderr (capped), their full sizes, the exit code (None when
        the stream did not end in time), and the last bytes of stderr."""
        import docker.errors

        try:
            eid = self.api.exec_create(
                self.cid,
                argv,
                stdin=stdin is not None,
                user=user,
                workdir="/work",
                environment=_ENV,
            )["Id"]
            sock = self.api.exec_start(eid, socket=True)
        except docker.errors.NotFound:
            raise SandboxError(f"sandbox container {self.cid[:12]} is gone") from None
        except docker.errors.APIError as e:
            raise SandboxError(f"docker exec failed in {self.cid[:12]}: {e}") from e
        raw: socket.socket = getattr(sock, "_sock", sock)
        bufs = (bytearray(), bytearray())
        tail = bytearray()
        totals = [0, 0]
        complete = False
        try:
            if stdin is not None:
                raw.settimeout(max(deadline - time.monotonic(), 0.1))
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            pending = b""
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                raw.settimeout(remaining)
                try:
                    chunk = raw.recv(65536)
                except TimeoutError:
                    break
                if not chunk:
                    complete = True
                    break
                pending += chunk
                while len(pending) >= 8:
                    stream, size = pending[0], struct.unpack(">I", pending[4:8])[0]
                    if len(pending) < 8 + size:
                        break
                    payload, pending = pending[8 : 8 + size], pending[8 + size :]
                    which = 1 if stream == 2 else 0
                    if which:
                        tail = (tail + payload)[-512:]
                    totals[which] += len(payload)
                    room = caps[which] - len(bufs[which])
                    if room > 0:
                        bufs[which].extend(payload[:room])
        finally:
            with contextlib.suppress(OSError):
                raw.close()
            with contextlib.suppress(Exception):
                sock.close()
        code: int | None = None
        if complete:
            with contextlib.suppress(docker.errors.APIError):
                code = self.api.exec_inspect(eid).get("ExitCode")
        return bytes(bufs[0]), bytes(bufs[1]), (totals[0], totals[1]), code, bytes(tail)


def reset_container(client: Any, container_id: str) -> bool:
    """Kill the sandbox user's processes and empty the writable places; True if now clean."""
    try:
        out, _, _, code, _ = _Exec(client, container_id)(
            ["/bin/sh", "-c", _RESET],
            stdin=None,
            deadline=time.monotonic() + 30,
            caps=(4096, 4096),
        )
    except SandboxError:
        return False
    return code == 0 and out.split() == [b"0", b"0", b"0"]


def _parse_status(tail: bytes) -> tuple[tuple[int, int, int], int] | None:
    """The wrapper's ``(exit code, oom kills, survivors)`` and the length of its status line."""
    key = b"\n" + _MARK.encode() + b" "
    at = tail.rfind(key)
    if at < 0:
        return None
    try:
        rc, oom, live = (int(x) for x in tail[at + len(key) :].split())
    except ValueError:
        return None
    return (rc, oom, live), len(tail) - at


class DockerSandbox(BaseSandbox):
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

    def run(
        self, cmd: str | list[str], *, timeout: float = 10.0, stdin: str | None = None
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return self._run(argv, timeout, stdin.encode() if stdin is not None else None)

    def run_python(self, code: str, *, timeout: float = 10.0) -> ExecResult:
        source = code.encode()
        if len(source) <= _STDIN_CODE_LIMIT:
            return self._run(["python3", "-c", code], timeout, None)
        return self._run(["python3", "-"], timeout, source)

    def write_file(self, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        target = self._path(path)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        with self._lock:
            self._ready()
            _, err, _, code, _ = self._exec(
                ["/bin/sh", "-c", script, "sh", target],
                stdin=data,
                deadline=time.monotonic() + 60,
                caps=(4096, 4096),
            )
        if code != 0:
            msg = err.decode(errors="replace").strip()
            raise ToolError(f"cannot write {path}: {msg or f'exit code {code}'}")

    def read_file(self, path: str) -> bytes:
        target = self._path(path)
        with self._lock:
            self._ready()
            out, err, _, code, _ = self._exec(
                ["cat", "--", target],
                stdin=None,
                deadline=time.monotonic() + 60,
                caps=(self.limits.disk_mb * 2**20, 4096),
            )
        if code != 0:
            msg = err.decode(errors="replace").strip()
            raise ToolError(f"cannot read {path}: {msg or f'exit code {code}'}")
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

    def _path(self, path: str) -> str:
        full = posixpath.normpath(posixpath.join("/work", path))
        if full == "/work" or not full.startswith("/work/"):
            raise ToolError(f"path {path!r} is outside the work directory /work")
        return full

    def _ready(self) -> None:
        if self._closed:
            raise SandboxError("docker sandbox is closed")
        if self._tainted:
            self._replace()

    def _replace(self) -> None:
        """Swap in a fresh container (the old one had survivors or could not be reset)."""
        log.warning("replacing sandbox container %s", self.container_id[:12])
        self._pool.release(self._container, reusable=False)
        self._container = self._pool.acquire()
        self._exec = _Exec(self._pool.client, self._container.id)
        self._tainted = False

    def _run(self, argv: list[str], timeout: float, stdin: bytes | None) -> ExecResult:
        if timeout <= 0:
            raise ValueError(f"timeout={timeout} must be positive")
        cap = self.limits.max_output_bytes
        with self._lock:
            self._ready()
            start = time.monotonic()
            out, err, totals, code, tail = self._exec(
                ["/bin/sh", "-c", _WRAPPER, "sh", f"{timeout:.3f}", _MARK, *argv],
                stdin=stdin,
                deadline=start + timeout + _GRACE_S,
                caps=(cap, cap + 256),
            )
            duration = time.monotonic() - start
            parsed = _parse_status(tail)
            if parsed is None or parsed[0][2] > 0:
                # The wrapper itself was killed, or something outlived kill -9: never reuse it.
                self._tainted = True
        if parsed is not None:
            (rc, oom, _), status_len = parsed
            err_len = totals[1] - status_len  # the program's own stderr, without the status
            err = err[: max(0, min(err_len, cap))]
        else:
            rc, oom = (code if code is not None else 137), 0
            err_len = totals[1]
            err = err[:cap]
        timed_out = code is None or (rc == 137 and oom == 0 and duration >= timeout * 0.95)
        return ExecResult(
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            exit_code=rc,
            timed_out=timed_out,
            oom_killed=oom > 0,
            truncated=totals[0] > cap or err_len > cap,
            duration_s=duration,
        )
