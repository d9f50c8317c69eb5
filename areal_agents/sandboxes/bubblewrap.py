"""The bubblewrap backend: Linux namespaces without a daemon.

Each call starts ``bwrap --unshare-all --die-with-parent`` over a read-only view of the host's
``/usr`` (so Python and its standard library come from the host), a fresh ``/proc`` and ``/dev``,
a private ``/tmp``, and the sandbox's work directory bound at ``/work``. The new network namespace
has only a loopback that is down; the new PID namespace ends every process when the call's main
process exits, so nothing survives a call. Limits are rlimits (address space per process, file
size, open files, CPU seconds), and when the host process is root each sandbox runs under its own
throw-away uid, which makes ``RLIMIT_NPROC`` a per-sandbox process limit. Unlike docker there
is no cgroup: memory is limited per process; ``/tmp`` is a tmpfs of ``disk_mb``; the work
directory (a host directory, so that files persist between calls) is limited per file by
``RLIMIT_FSIZE`` and in total by a watcher that kills the call and empties it when it outgrows
``disk_mb`` (checked every 0.1 s, so a fast writer can overshoot briefly). ``reset`` swaps in a
new work directory (see ``_local``), so its mode, times and extended attributes start afresh;
``/tmp``, IPC objects and message queues live in per-call namespaces and never outlive a call.

``bwrap`` returns its program's exit status as soon as its own init (pid 1 of the new namespace)
reports it, before that init is reaped; the orphaned init then waits as a zombie, still counted
against the uid's ``RLIMIT_NPROC``, until the host's init reaps it, which on some hosts takes
seconds. Back-to-back calls would then fail with "Can't fork for pid 1". So each call runs
``bwrap`` as the init of a PID namespace of its own (util-linux ``unshare``, see
:func:`unshare_prefix`), whose end the kernel reaps whole before ``unshare`` returns, or, where
``unshare`` cannot, under :data:`REAPER`, a Python child subreaper that waits for every process
left below it before it exits with ``bwrap``'s status.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from areal_agents.sandboxes._local import LocalSandbox, runnable_python, runs_as
from areal_agents.sandboxes.base import SandboxLimits

__all__ = ["REAPER", "BubblewrapSandbox", "bubblewrap_problem", "unshare_prefix"]

REAPER = """\
import os, signal, sys
try:
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans below come here
except Exception:
    pass
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
status = os.waitpid(pid, 0)[1]
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.WEXITSTATUS(status))
"""
"""Run as ``python -I -S -c REAPER argv...``: runs ``argv``, reaps every process orphaned below
it (bwrap's init above all), then ends as ``argv`` ended (its exit code, or its signal)."""

_PASSWD = "root:x:0:0:root:/root:/bin/sh\nsandbox:x:65534:65534:sandbox:/work:/bin/sh\n"
_GROUP = "root:x:0:\nsandbox:x:65534:\n"
_PROBE_TAIL = ("--dev", "/dev", "--", "/usr/bin/true")
_ETC_FILES = ("ld.so.cache", "localtime", "nsswitch.conf")


def bubblewrap_problem() -> str | None:
    """None when ``bwrap`` can create its namespaces here, else the reason."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    try:
        probe = subprocess.run(
            [bwrap, "--unshare-all", "--ro-bind", "/usr", "/usr", *_root_links(), *_PROBE_TAIL],
            capture_output=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap failed to start: {e}"
    if probe.returncode != 0:
        msg = probe.stderr.decode(errors="replace").strip()
        return f"bwrap cannot create namespaces here (user namespaces disabled?): {msg}"
    return None


_UNSHARE_FLAGS = ("--user", "--map-current-user", "--pid", "--fork", "--kill-child")


@functools.cache
def unshare_prefix(uid: int | None) -> tuple[str, ...] | None:
    """The util-linux ``unshare`` command that gives ``bwrap`` a PID namespace of its own, where
    ``uid`` (None: this process's) can run it (``--map-current-user`` needs util-linux 2.38);
    None where it cannot. When ``bwrap``, the init there, exits, the kernel reaps everything below
    it before ``unshare`` reaps ``bwrap``: a C program, about 1 ms a call, against about 15 ms
    for :data:`REAPER`'s Python."""
    unshare = shutil.which("unshare", path="/usr/bin:/bin")
    if unshare is None:
        return None
    cmd = (unshare, *_UNSHARE_FLAGS)
    return cmd if runs_as(uid, [*cmd, "/bin/true"]) else None


def _root_links() -> list[str]:
    """Bind or link ``/bin``, ``/lib``... the way the host has them (merged ``/usr`` or not)."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    return args


class BubblewrapSandbox(LocalSandbox):
    """Programs in fresh namespaces over a read-only host ``/usr``, work directory ``/work``.

    >>> with BubblewrapSandbox() as sb:  # doctest: +SKIP
    ...     sb.run("id -u; ls /").stdout
    '65534\\nbin\\ndev\\netc\\nlib\\nlib64\\nproc\\nsbin\\ntmp\\nusr\\nwork\\n'
    """

    backend = "bubblewrap"
    work_path = "/work"
    pid_namespace = True  # bwrap's init exits with the program, and the kernel ends the rest

    def __init__(self, limits: SandboxLimits | None = None, python: str | None = None) -> None:
        super().__init__(limits)
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            from areal_agents.errors import SandboxUnavailableError

            raise SandboxUnavailableError("bwrap is not installed (apt-get install bubblewrap)")
        etc = self._root / "etc"
        etc.mkdir()
        (etc / "passwd").write_text(_PASSWD)
        (etc / "group").write_text(_GROUP)
        for p in (etc, etc / "passwd", etc / "group"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        self._root.chmod(0o755)  # the sandbox uid must reach work/ and etc/ below it
        self._prefix = [
            bwrap,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
            *_root_links(),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(self.limits.disk_mb * 2**20),
            "--tmpfs",
            "/tmp",
            "--dir",
            "/etc",
            "--ro-bind",
            str(etc / "passwd"),
            "/etc/passwd",
            "--ro-bind",
            str(etc / "group"),
            "/etc/group",
        ]
        for name in _ETC_FILES:
            self._prefix += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        self._prefix += [
            "--bind",
            str(self.work_dir),
            "/work",
            "--remount-ro",
            "/",
            "--chdir",
            "/work",
            "--uid",
            "65534",
            "--gid",
            "65534",
            "--",
        ]
        self._py = python

    def _wrap(self, argv: list[str]) -> list[str]:
        reaper = unshare_prefix(self.uid) or (self._python(), "-I", "-S", "-c", REAPER)
        return [*reaper, *self._prefix, *argv]

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/work",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def _python(self) -> str:
        if self._py is None:
            # Only the host's /usr is visible inside: the interpreter must live there.
            self._py = runnable_python(self.uid, ("/usr/bin/python3", "/usr/local/bin/python3"))
        return self._py
