"""Running one program on the host: in a new session, killed at its time limit, output capped.

:func:`capture` starts the program, reads its stdout and stderr as they come (keeping at most
``max_output`` bytes of each, and feeding ``stdin`` without blocking), kills it at the time limit,
and once its main process has exited, ends whatever it left behind (``kill_all``) and stops
reading after a grace period if something it cannot kill still holds the pipes.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable

from areal_agents.sandboxes.base import ExecResult

__all__ = ["capture", "decode_output", "signal_exit_code"]

_GRACE_S = 1.0  # how long output is read after the main process exited
_CHUNK = 65536


def decode_output(data: bytes) -> str:
    """Bytes from a program as text; undecodable bytes become U+FFFD."""
    return data.decode("utf-8", errors="replace")


def signal_exit_code(returncode: int) -> int:
    """``subprocess``'s ``-N`` for "killed by signal N" as the shell's ``128+N``."""
    return 128 - returncode if returncode < 0 else returncode


class _Pipes:
    """Reads stdout and stderr of a process, keeping at most ``cap`` bytes of each."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes | None, cap: int) -> None:
        self.cap = cap
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = False
        self.sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        self.sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        self.sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        self.stdin = memoryview(stdin) if stdin else None
        if proc.stdin is not None:
            if self.stdin:
                os.set_blocking(proc.stdin.fileno(), False)
                self.sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
            else:
                proc.stdin.close()

    @property
    def open(self) -> bool:
        return any(key.data != "stdin" for key in self.sel.get_map().values())

    def pump(self, wait: float) -> None:
        for key, _ in self.sel.select(max(wait, 0.0)):
            f = key.fileobj
            if key.data == "stdin":
                assert self.stdin is not None
                try:
                    n = os.write(key.fd, self.stdin[:_CHUNK])
                except (BrokenPipeError, OSError):
                    n = len(self.stdin)
                self.stdin = self.stdin[n:]
                if not self.stdin:
                    self.sel.unregister(f)
                    f.close()  # type: ignore[union-attr]
                continue
            data = os.read(key.fd, _CHUNK)
            if not data:
                self.sel.unregister(f)
                f.close()  # type: ignore[union-attr]
                continue
            buf = self.out[key.data]
            room = self.cap - len(buf)
            if len(data) > room:
                self.truncated = True
            if room > 0:
                buf += data[:room]

    def close(self) -> None:
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fileobj)
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()


def capture(
    argv: list[str],
    *,
    timeout: float,
    max_output: int,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    uid: int | None = None,
    preexec_fn: Callable[[], None] | None = None,
    kill_all: Callable[[], None] | None = None,
    watch: Callable[[], str | None] | None = None,
    kill_all_on_exit: bool = True,
) -> ExecResult:
    """Run ``argv`` in a new session, kill it at ``timeout``, keep ``max_output`` bytes per stream.

    ``kill_all`` ends every process the call may have left behind (the default kills the process
    group); it runs on timeout and, unless ``kill_all_on_exit`` is false, once the main process
    has exited. ``watch`` is polled
    about every 0.1 s while the program runs; a message from it kills the call and is appended
    to stderr.
    """
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            user=uid,
            group=uid,
            extra_groups=[] if uid is not None else None,
            preexec_fn=preexec_fn,
        )
    except OSError as e:  # E2BIG, ENOENT: the program's mistake, reported like a shell would
        code = 127 if isinstance(e, FileNotFoundError) else 126
        return ExecResult(
            stdout="",
            stderr=f"{argv[0]}: {e.strerror}\n",
            exit_code=code,
            duration_s=time.monotonic() - start,
        )
    except (ValueError, UnicodeError) as e:  # a NUL byte or unencodable text in argv
        return ExecResult(stdout="", stderr=f"sandbox: {e}; nothing was run\n", exit_code=126)

    def kill(on_exit: bool = False) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if kill_all is not None and (kill_all_on_exit or not on_exit):
            kill_all()

    pipes = _Pipes(proc, stdin, max_output)
    deadline = start + timeout
    timed_out = False
    exited_at: float | None = None
    verdict: str | None = None
    next_watch = start + 0.1
    try:
        while True:
            now = time.monotonic()
            if watch is not None and exited_at is None and now >= next_watch:
                next_watch = now + 0.1
                verdict = verdict or watch()
                if verdict is not None:
                    kill()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
                kill(on_exit=True)  # background children must not outlive the call
            if not pipes.open and exited_at is not None:
                break
            if exited_at is None and now >= deadline:
                timed_out = True
                kill()
                proc.wait()
                continue
            if exited_at is not None and now - exited_at > _GRACE_S:
                break  # something we cannot kill still holds the pipes; stop reading
            pipes.pump(min(0.05, deadline - now) if exited_at is None else 0.05)
    finally:
        pipes.close()
        if proc.poll() is None:
            kill()
        proc.wait()
    err = bytes(pipes.out["stderr"])
    if verdict is not None:
        err += f"\n[sandbox: {verdict}; the program was killed]\n".encode()
    return ExecResult(
        stdout=decode_output(bytes(pipes.out["stdout"])),
        stderr=decode_output(err),
        exit_code=signal_exit_code(proc.returncode),
        timed_out=timed_out,
        truncated=pipes.truncated,
        duration_s=time.monotonic() - start,
    )
