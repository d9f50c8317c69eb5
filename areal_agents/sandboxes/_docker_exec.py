"""What the docker sandbox and its warm pool share: one ``docker exec`` and the scripts it runs.

:class:`_Exec` runs one command over a hijacked exec socket: stdin is sent while output is read
(so neither side can block the other, and a program that stops reading its stdin ends the send,
not the call), stdout and stderr are capped as they arrive, and the exit code comes from the
engine (``exec_inspect``), never from the output.

:data:`WRAPPER` runs as the container's root, which holds only the capabilities ``KILL``,
``SETUID``, ``SETGID`` and ``SYS_CHROOT`` (see ``docker_pool``), and supervises one run (the
design is in ``docker``'s module docstring). It kills with ``killall``: root sends SIGKILL to
every process whose real uid is the sandbox user's, found in ``/proc``, until none is left; a
program cannot signal, stop or trace root, so nothing it does can keep that loop from running.

:func:`reset_container` cleans a container between episodes with one exec of ``._wipe`` as the
sandbox user: SIGKILL to every other process of that user (after a run's root sweep there is
none), then the writable places emptied and restored, then a count of what is left. Should a
process of the user have survived anyway and fight the reset (stop or kill it), the reset fails
or misses its deadline, and the container is replaced rather than reused.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import struct
import time
from pathlib import Path
from typing import Any

from areal_agents.errors import SandboxError

log = logging.getLogger(__name__)

__all__ = [
    "SANDBOX_USER",
    "START_TRIES",
    "STATUS_VAR",
    "WRAPPER",
    "never_started",
    "parse_status",
    "reset_container",
]

SANDBOX_UID = 65534
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
ROOT_USER = "0:0"
STATUS_VAR = "AREAL_STATUS_MARK"  # the wrapper's per-call secret, only in root's environment
ENV = {"HOME": "/work", "TMPDIR": "/tmp", "PYTHONUNBUFFERED": "1"}
_INSPECT_S = 5.0  # how long the engine may take to record an exit after the stream ended
_RESET_S = 30.0  # a reset that takes longer is given up and the container replaced
START_TRIES = 3
"""Tries of one exec, where the runtime fails to start it (:func:`never_started`)."""
_NOT_STARTED = b"OCI runtime exec failed"
_DROP = f"/usr/sbin/chroot --userspec={SANDBOX_USER} --groups= --skip-chdir /"

# oom: the cgroup's oom_kill counter into $n (v1 or v2). sweep: SIGKILL every live process of
# the sandbox uid (init and this shell are root), their count into $s; the real uid is read from
# status, as /proc/PID of a process that made itself non-dumpable belongs to root. killall:
# sweep until a sweep finds none (or give up).
_FUNCS = rf"""
oom() {{ n=0
  for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
    [ -r "$f" ] || continue
    while read -r k v; do [ "$k" = oom_kill ] && n=$v; done < "$f"
  done; }}
sweep() {{ s=0
  for d in /proc/[0-9]*; do
    case ${{d#/proc/}} in 1|$$) continue;; esac
    u=; z=
    {{ while read -r k v _; do
        case $k in State:) z=$v;; Uid:) u=$v; break;; esac
      done < "$d/status"; }} 2>/dev/null
    [ "$u" = {SANDBOX_UID} ] || continue
    case $z in Z|X) continue;; esac
    kill -9 "${{d#/proc/}}" 2>/dev/null; s=$((s+1))
  done; }}
killall() {{ sweep
  for _ in 1 2 3 4 5 6 7 8 9 10; do [ $s = 0 ] && return; sleep 0.01 || :; sweep; done; }}
"""

# $1: the time limit, then the program's argv; the status marker in $AREAL_STATUS_MARK. The
# program runs as the sandbox user (chroot to "/" only drops the ids: uid, gid, no groups; the
# kernel clears every capability on leaving uid 0). After it: kill everything of that uid, then
# one status line on stderr (fd 3, a copy the program does not get): marker, exit code, OOM
# kills, processes still alive. The stream is the program's stderr too, but by then nothing of
# the program is left to write, and it never knew the marker. Only shell built-ins run after the
# program, except `sleep` between sweeps while something is still dying.
WRAPPER = (
    _FUNCS
    + rf"""
m=${STATUS_VAR}; unset {STATUS_VAR}
t=$1; shift
oom; o=$n
exec 3>&2
timeout -s KILL "$t" {_DROP} "$@" 3>&-
rc=$?
exec 2>/dev/null
killall
oom
printf '\n%s %s %s %s\n' "$m" "$rc" "$((n-o))" "$s" >&3
exit $rc
"""
)

_WIPE_SOURCE = Path(__file__).with_name("_wipe.py").read_text()


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
        env: dict[str, str] | None = None,
    ) -> tuple[bytes, bytes, tuple[int, int], int | None, bytes]:
        """Run ``argv``: stdout and stderr (capped), their full sizes, the exit code (None when
        the stream did not end in time), and the last bytes of stderr. ``env`` is added to the
        sandbox's environment. An exec the runtime failed to start (:func:`never_started`) is
        tried again, up to :data:`START_TRIES` times in all: nothing of ``argv`` ran."""
        result = self._once(argv, stdin=stdin, deadline=deadline, caps=caps, user=user, env=env)
        for attempt in range(1, START_TRIES):
            if not never_started(result[0], result[2], result[3]):
                break
            log.info("docker exec in %s did not start; trying again", self.cid[:12])
            time.sleep(0.02 * attempt)
            result = self._once(argv, stdin=stdin, deadline=deadline, caps=caps, user=user, env=env)
        return result

    def _once(
        self,
        argv: list[str],
        *,
        stdin: bytes | None,
        deadline: float,
        caps: tuple[int, int],
        user: str,
        env: dict[str, str] | None,
    ) -> tuple[bytes, bytes, tuple[int, int], int | None, bytes]:
        import docker.errors

        try:
            eid = self.api.exec_create(
                self.cid,
                argv,
                stdin=stdin is not None,
                user=user,
                workdir="/work",
                environment={**ENV, **(env or {})},
            )["Id"]
            sock = self.api.exec_start(eid, socket=True)
        except docker.errors.NotFound:
            raise SandboxError(f"sandbox container {self.cid[:12]} is gone") from None
        except docker.errors.APIError as e:
            raise SandboxError(f"docker exec failed in {self.cid[:12]}: {e}") from e
        raw: socket.socket = getattr(sock, "_sock", sock)
        frames = _Frames(caps)
        try:
            ended = _pump(raw, stdin, deadline, frames)
        finally:
            with contextlib.suppress(OSError):
                raw.close()
            with contextlib.suppress(Exception):
                sock.close()
        code = self._exit_code(eid) if ended else None
        out, err = frames.bufs
        return (
            bytes(out),
            bytes(err),
            (frames.totals[0], frames.totals[1]),
            code,
            bytes(frames.tail),
        )

    def _exit_code(self, eid: str) -> int | None:
        """The exec's exit code as the engine recorded it (it may lag the stream's end)."""
        import docker.errors

        wait, give_up = 0.002, time.monotonic() + _INSPECT_S
        while True:
            try:
                info = self.api.exec_inspect(eid)
            except docker.errors.APIError:
                return None
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if code is not None else None
            if time.monotonic() > give_up:
                return None
            time.sleep(wait)
            wait = min(wait * 2, 0.25)


def never_started(out: bytes, totals: tuple[int, int], code: int | None) -> bool:
    r"""Whether an exec failed before its program ran: the engine's exit code 126 and, as all of
    the stream, runc's one-line ``OCI runtime exec failed`` on stdout (seen about once in 300
    quick execs at ``pids=8``, when runc's exec init cannot start). Nothing that did start
    produces it: a run's wrapper ends its stream with the status line on stderr, and a file
    operation's script reads the file in and out with ``cat``, which never exits 126.

    >>> runc = (b"OCI runtime exec failed: exec failed: unable to start container process: "
    ...     b"read init-p: connection reset by peer: unknown\r\n")
    >>> never_started(runc, (len(runc), 0), 126)
    True
    >>> never_started(b"OCI runtime exec failed\n", (24, 7), 126)  # anything on stderr: ran
    False
    """
    return (
        code == 126
        and totals == (len(out), 0)
        and out.startswith(_NOT_STARTED)
        and out.rstrip(b"\r\n").count(b"\n") == 0
    )


class _Frames:
    """Docker's multiplexed stream (8-byte header: stream, size) into two capped buffers."""

    def __init__(self, caps: tuple[int, int]) -> None:
        self.caps = caps
        self.bufs = (bytearray(), bytearray())
        self.totals = [0, 0]
        self.tail = bytearray()
        self.pending = b""

    def feed(self, chunk: bytes) -> None:
        pending = self.pending + chunk
        while len(pending) >= 8:
            stream, size = pending[0], struct.unpack(">I", pending[4:8])[0]
            if len(pending) < 8 + size:
                break
            payload, pending = pending[8 : 8 + size], pending[8 + size :]
            which = 1 if stream == 2 else 0
            if which:
                self.tail = (self.tail + payload)[-512:]
            self.totals[which] += len(payload)
            room = self.caps[which] - len(self.bufs[which])
            if room > 0:
                self.bufs[which].extend(payload[:room])
        self.pending = pending


def _pump(raw: socket.socket, stdin: bytes | None, deadline: float, frames: _Frames) -> bool:
    """Send ``stdin`` and read frames until the stream ends (True) or ``deadline`` (False)."""
    todo = memoryview(stdin) if stdin else None
    raw.setblocking(False)
    sel = selectors.DefaultSelector()
    try:
        sel.register(raw, selectors.EVENT_READ | (selectors.EVENT_WRITE if todo else 0))
        if stdin is not None and not todo:
            _close_write(raw)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for _, events in sel.select(remaining):
                if events & selectors.EVENT_WRITE and todo is not None:
                    try:
                        todo = todo[raw.send(todo[:65536]) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # the program closed its stdin or ended: drop the rest
                        todo = todo[:0]
                    if not todo:
                        todo = None
                        _close_write(raw)
                        sel.modify(raw, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    try:
                        chunk = raw.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return True  # the engine closed the stream: ask it how the exec ended
                    if not chunk:
                        return True
                    frames.feed(chunk)
    finally:
        sel.close()


def _close_write(raw: socket.socket) -> None:
    with contextlib.suppress(OSError):
        raw.shutdown(socket.SHUT_WR)


def parse_status(tail: bytes, mark: str) -> tuple[tuple[int, int, int], int] | None:
    """The wrapper's ``(exit code, oom kills, survivors)`` and the length of its status line,
    when the stream ends with exactly that line."""
    key = b"\n" + mark.encode() + b" "
    at = tail.rfind(key)
    if at < 0:
        return None
    line = tail[at + len(key) :]
    if not line.endswith(b"\n") or line.count(b"\n") != 1:
        return None
    try:
        rc, oom, live = (int(x) for x in line.split())
    except ValueError:
        return None
    return (rc, oom, live), len(tail) - at


def reset_container(client: Any, container_id: str) -> bool:
    """Kill the sandbox user's processes, empty and restore the writable places (``/work``,
    ``/tmp``, ``/dev/shm``, ``/dev/mqueue``, System V IPC); True if the container is now as new."""
    try:
        out, _, _, code, _ = _Exec(client, container_id)(
            ["python3", "-I", "-S", "-c", _WIPE_SOURCE],
            stdin=None,
            deadline=time.monotonic() + _RESET_S,
            caps=(4096, 4096),
        )
    except SandboxError:
        return False
    return code == 0 and out.split() == [b"0", b"0", b"0", b"0"]
