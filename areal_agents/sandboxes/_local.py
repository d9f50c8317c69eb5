"""What the two daemon-less backends share: a host work directory, a throw-away uid, rlimits,
and the capped, time-limited subprocess runner of :mod:`._capture`.

When the host process is root, every sandbox runs its programs under its own unused uid (picked at
random from a high range), so that ``RLIMIT_NPROC`` binds (it never binds root), host files
readable only by root stay unreadable, and one ``kill(-1, SIGKILL)`` issued as that uid ends every
process the sandbox ever started, including those that left the process group with ``setsid``.
If that helper cannot finish (a program of the uid stops or kills it), the host sends SIGKILL to
each process of the uid it finds in ``/proc`` instead, which no program can stop.

``reset`` kills, then replaces the work directory with a new empty one (so that no file, mode,
time, extended attribute or ACL an episode set survives it), and removes the old one without
recursion (:mod:`._wipe`): trees of any depth and FIFOs never stop a reset or ``close``. File
operations follow the rules every backend shares (:mod:`._inputs`): FIFOs and other special
files are refused without being opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import random
import resource
import secrets
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from areal_agents.errors import SandboxError, ToolError
from areal_agents.sandboxes._capture import capture
from areal_agents.sandboxes._inputs import (
    CommandRunner,
    encode_data,
    os_problem,
    problem,
    work_relpath,
)
from areal_agents.sandboxes._killuid import kill_uid
from areal_agents.sandboxes._wipe import disk_usage, remove_tree
from areal_agents.sandboxes.base import BaseSandbox, ExecResult, SandboxLimits

__all__ = ["LocalSandbox", "rlimit_setter", "runnable_python", "runs_as"]

_UID_RANGE = (1_100_000_000, 1_900_000_000)

log = logging.getLogger(__name__)


def _limit(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def rlimit_setter(limits: SandboxLimits, timeout: float) -> Callable[[], None]:
    """A ``preexec_fn`` that applies ``limits`` to the child (and, inherited, its children)."""
    mem = limits.memory_mb * 2**20
    fsize = limits.disk_mb * 2**20
    cpu = int(timeout) + 2

    def apply() -> None:
        _limit(resource.RLIMIT_AS, mem)
        _limit(resource.RLIMIT_FSIZE, fsize)
        _limit(resource.RLIMIT_NOFILE, limits.open_files)
        _limit(resource.RLIMIT_CPU, cpu)
        _limit(resource.RLIMIT_CORE, 0)
        if os.getuid() != 0:
            _limit(resource.RLIMIT_NPROC, limits.pids)

    return apply


def _looks_oom(res: ExecResult) -> bool:
    """A program that died of an address-space limit says so on stderr."""
    tail = res.stderr[-400:]
    return res.exit_code != 0 and ("MemoryError" in tail or "Cannot allocate memory" in tail)


class LocalSandbox(CommandRunner, BaseSandbox):
    """A host work directory plus a way to wrap commands; subclasses define the wrapping."""

    work_path = "."
    pid_namespace = False
    """True when the end of a call's main process ends all of its processes (bubblewrap)."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self._lock = threading.Lock()
        self._closed = False
        self.uid = random.randrange(*_UID_RANGE) if os.geteuid() == 0 else None
        self._root = Path(tempfile.mkdtemp(prefix=f"areal-{self.backend}-"))
        self.work_dir = self._root / "work"
        self._make_work_dir()

    # --- what subclasses provide ------------------------------------------------------------

    def _wrap(self, argv: list[str]) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        raise NotImplementedError

    def _python(self) -> str:
        raise NotImplementedError

    # --- the Sandbox contract -----------------------------------------------------------------

    def write_file(self, path: str, content: str | bytes) -> None:
        data = encode_data(content)
        limit = self.limits.disk_mb * 2**20
        if len(data) > limit:
            raise ToolError(
                f"file of {len(data)} bytes exceeds the sandbox's {self.limits.disk_mb} MB"
            )
        with self._lock:
            target = self._resolve(path)
            try:
                st = os.lstat(target)
            except FileNotFoundError:
                old = 0
            except OSError as e:
                raise os_problem(e, path, "write") from None
            else:
                if not stat.S_ISREG(st.st_mode):
                    raise problem("irregular", path)
                old = st.st_blocks * 512
            if disk_usage(self.work_dir) - old + len(data) > limit:
                raise problem("space", path)
            self._make_parents(target, path)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
            try:
                fd = os.open(target, flags | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise os_problem(e, path, "write") from None
            with os.fdopen(fd, "wb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise problem("irregular", path)
                try:
                    f.write(data)
                except OSError as e:
                    raise os_problem(e, path, "write") from None
            if self.uid is not None:
                os.lchown(target, self.uid, self.uid)

    def read_file(self, path: str) -> bytes:
        with self._lock:
            target = self._resolve(path)
            try:
                if not stat.S_ISREG(os.stat(target).st_mode):
                    raise problem("irregular", path)
                # O_NONBLOCK: a FIFO swapped in after the check still cannot block the open
                fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except NotADirectoryError:  # "a.txt/b": no such file, as docker's shell finds
                raise problem("missing", path) from None
            except OSError as e:
                raise os_problem(e, path, "read") from None
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise problem("irregular", path)
                return f.read(self.limits.disk_mb * 2**20 + 1)

    def reset(self) -> None:
        with self._lock:
            self._check_open()
            self._kill_all()
            self._fresh_work_dir()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._kill_all()
            try:
                remove_tree(self._root)
            except OSError as e:
                log.warning("could not remove sandbox directory %s: %s", self._root, e)

    # --- helpers ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{self.backend} sandbox is closed")

    def _kill_all(self) -> None:
        if self.uid is not None:
            kill_uid(self.uid)

    def _make_work_dir(self) -> None:
        self.work_dir.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(self.work_dir, self.uid, self.uid)
        self.work_dir.chmod(0o700)  # whatever the umask

    def _fresh_work_dir(self) -> None:
        """Swap in a new, empty work directory (mode 0700, the sandbox's owner, times of now,
        no extended attributes or ACLs), then remove the old one, however deep."""
        old = self._root / f"old-{secrets.token_hex(4)}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.work_dir, old)
        self._make_work_dir()
        try:
            remove_tree(old)
        except OSError as e:  # close() tries again with the whole root
            log.warning("could not remove an old sandbox work directory %s: %s", old, e)

    def _disk_used(self) -> int:
        return disk_usage(self.work_dir)

    def _watch_disk(self) -> str | None:
        """The work directory is a host directory: enforce its total size by watching it."""
        if self._disk_used() > self.limits.disk_mb * 2**20:
            self._kill_all()
            self._fresh_work_dir()
            return f"work directory exceeded {self.limits.disk_mb} MB and was emptied"
        return None

    def _resolve(self, path: str) -> Path:
        """``path`` inside the work directory, its symlinks resolved as the program sees them
        (an absolute target names a path in the sandbox, where the work directory is
        ``work_path``); a link that leads out of the work directory is refused."""
        self._check_open()
        pending = work_relpath(path, self.work_path).split("/")
        root = self.work_dir.resolve()
        inside = self.work_path.rstrip("/")
        done: list[str] = []
        links = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not done:
                    raise problem("outside", path)
                done.pop()
                continue
            try:
                target = os.readlink(root.joinpath(*done, part))
            except OSError:  # not a link, or missing: taken as it is, as realpath -m does
                done.append(part)
                continue
            links += 1
            if links > 40:
                raise ToolError(f"cannot access {path!r}: too many levels of symbolic links")
            if target.startswith("/"):
                if target != inside and not target.startswith(inside + "/"):
                    raise problem("outside", path)
                done, target = [], target[len(inside) :]
            pending = target.split("/") + pending
        if not done:
            raise problem("workdir", path)
        return root.joinpath(*done)

    def _make_parents(self, target: Path, path: str) -> None:
        """Create the missing directories above ``target``, owned by the sandbox's uid."""
        root = self.work_dir.resolve()
        missing = []
        for parent in target.parents:
            if parent == root or os.path.lexists(parent):
                break
            missing.append(parent)
        for parent in reversed(missing):
            try:
                os.mkdir(parent, 0o755)
            except OSError as e:
                raise os_problem(e, path, "write") from None
            if self.uid is not None:
                os.lchown(parent, self.uid, self.uid)
        if not target.parent.is_dir():
            raise problem("notdir", path)

    def _run_argv(self, argv: list[str], timeout: float, stdin: bytes | None) -> ExecResult:
        if not timeout > 0:
            raise ValueError(f"timeout={timeout} must be positive")
        with self._lock:
            self._check_open()
            res = capture(
                self._wrap(argv),
                timeout=timeout,
                max_output=self.limits.max_output_bytes,
                stdin=stdin,
                env=self._env(),
                cwd=str(self.work_dir),
                uid=self.uid,
                preexec_fn=rlimit_setter(self.limits, timeout),
                kill_all=self._kill_all,
                watch=self._watch_disk,
                kill_all_on_exit=not self.pid_namespace,
            )
        if _looks_oom(res):
            res = dataclasses.replace(res, oom_killed=True)
        return res


def runs_as(uid: int | None, argv: list[str]) -> bool:
    """Whether ``argv`` succeeds when ``uid`` (None: this process's user) runs it, from ``/``."""
    try:
        probe = subprocess.run(
            argv,
            user=uid,
            group=uid,
            extra_groups=[] if uid is not None else None,
            capture_output=True,
            timeout=20,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@functools.cache
def runnable_python(uid: int | None, candidates: tuple[str, ...]) -> str:
    """The first interpreter in ``candidates`` that ``uid`` can start."""
    for cand in candidates:
        if cand and os.path.exists(cand) and runs_as(uid, [cand, "-c", "import json"]):
            return cand
    raise SandboxError(f"no Python interpreter the sandbox user can run among {candidates}")
