"""What a grading worker gives up before it reads its one job (Linux; see :mod:`.isolation`).

A worker is forked from the zygote, confined here, used for exactly one grade and discarded.
:func:`confine` applies, in this order (each step best effort where the platform lacks it; the
:class:`Confinement` it returns says what took effect):

* **descriptors**: stdin, stdout and stderr point at ``/dev/null``; every other descriptor but
  the worker's own socket is closed;
* **limits** (``setrlimit``): address space ``memory_mb``; no core files; file size 0 (writing
  one byte to a regular file kills the process); at most 64 open descriptors; no new processes
  and no new threads either (``RLIMIT_NPROC`` 0 counts both; in force once the uid is not
  root's); CPU time as a backstop;
* **identity**: run as root, the worker becomes a uid and gid of its own (``UID_BASE`` + its
  pid, no supplementary groups), so that it owns no file and cannot signal or trace another
  worker; where that uid cannot be had (a user namespace that maps few ids), ``nobody``
  (65534). Any capability still held after that is dropped. Not dumpable, no new privileges
  (``setuid`` programs do not raise them), killed when the zygote dies;
* **system calls** (seccomp, x86-64 and arm64): creating sockets, running programs, creating
  processes (the filter lets threads through; the process limit above stops them), tracing
  or signalling other processes, opening a file for writing, and every call that creates,
  removes, renames or changes a file, or mounts, unshares or uses io_uring, BPF, SysV IPC or
  keyrings fail with ``EPERM``;
* **environment**: the current directory is an empty directory nobody may write to; the
  environment is the zygote's, which holds only ``PATH``, ``LANG`` and the thread settings (the
  caller's variables, API keys included, never reach it); no bytecode is written.

Imports after the identity change: the interpreter may live where a stranger cannot read (a
home directory), and graders import lazily. So the zygote opens each import path that is not
readable by others as a directory descriptor, which its workers keep, and points the import
system at ``/proc/self/fd/N`` (path resolution from a descriptor does not cross the unreadable
parents); :func:`prepare` does this and the rest of the one-off work before any fork.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import resource
import signal
import stat
import struct
import sys
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["UID_BASE", "Confinement", "confine", "keep_with_parent", "prepare", "reroute_imports"]

#: Root's workers run as ``UID_BASE + pid`` (an id no account uses).
UID_BASE = 2_000_000_000
_NOBODY = 65534
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP = 1, 4, 38, 22
_SECCOMP_MODE_FILTER = 2
_O_PATH = getattr(os, "O_PATH", 0o10000000)


@dataclass
class Confinement:
    """What :func:`confine` put in force in this process."""

    uid: int = -1
    seccomp: bool = False
    limits: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:  # loaded once, in the zygote
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _prctl(libc: ctypes.CDLL, option: int, arg: int) -> bool:
    return int(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)) == 0


# ---- descriptors and limits --------------------------------------------------------------


def _close_descriptors(keep: set[int]) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    if null > 2 and null not in keep:
        os.close(null)
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, max(low + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))


def _set_limits(memory_mb: int | None, cpu_s: int, report: Confinement) -> None:
    wanted = {
        "RLIMIT_CORE": 0,
        "RLIMIT_FSIZE": 0,
        "RLIMIT_NOFILE": 64,
        "RLIMIT_NPROC": 0,
        "RLIMIT_CPU": cpu_s,
    }
    if memory_mb is not None:
        wanted["RLIMIT_AS"] = memory_mb << 20
    for name, value in wanted.items():
        which = getattr(resource, name)
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(which, (value, value if name != "RLIMIT_CPU" else hard))
        except (ValueError, OSError) as e:
            report.notes.append(f"{name}: {e}")
        else:
            report.limits[name] = value


# ---- imports that survive the identity change --------------------------------------------


def _readable_by_others(path: str) -> bool:
    """Whether a stranger can reach ``path`` (x on every parent, r and x on it)."""
    parts = os.path.abspath(path).split(os.sep)
    current = os.sep
    for part in parts[1:]:
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
        current = os.path.join(current, part)
    try:
        mode = os.stat(current).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IROTH and mode & stat.S_IXOTH)


_ROUTES: dict[str, int] = {}  # import path -> descriptor of it (opened in the zygote)


def reroute_imports() -> set[int]:
    """In the zygote (as root, before any fork): point the import system at descriptors for
    the import paths a stranger cannot read, and return the descriptors (workers keep them).
    Idempotent; call it again after importing more (new packages' ``__path__``)."""
    if os.geteuid() != 0:
        return set()
    for entry in sys.path:
        if not isinstance(entry, str) or not entry or entry.startswith("/proc/self/fd/"):
            continue
        path = os.path.abspath(entry)
        if path in _ROUTES or not os.path.isdir(path) or _readable_by_others(path):
            continue
        with contextlib.suppress(OSError):
            _ROUTES[path] = os.open(path, _O_PATH | os.O_DIRECTORY)
    if not _ROUTES:
        return set()
    prefixes = sorted(_ROUTES, key=len, reverse=True)

    def moved(path: str) -> str:
        for prefix in prefixes:
            if path == prefix or path.startswith(prefix + os.sep):
                return f"/proc/self/fd/{_ROUTES[prefix]}{path[len(prefix) :]}"
        return path

    def each(paths: Any) -> list[Any]:
        return [moved(p) if isinstance(p, str) else p for p in paths]

    sys.path[:] = each(sys.path)
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            with contextlib.suppress(Exception):
                search[:] = each(search)
        elif search is not None and type(search).__name__ == "_NamespacePath":
            with contextlib.suppress(Exception):
                module.__path__ = each(search)
    sys.path_importer_cache.clear()
    return set(_ROUTES.values())


# ---- identity ----------------------------------------------------------------------------


def _change_identity(report: Confinement) -> None:
    if os.geteuid() != 0:
        report.uid = os.geteuid()
        report.notes.append("not root: the uid is kept")
        return
    for uid in (UID_BASE + os.getpid(), _NOBODY):
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        except OSError as e:
            report.notes.append(f"uid {uid}: {e.strerror}")
            continue
        report.uid = uid
        return
    report.uid = 0
    _drop_capabilities(report)


def _drop_capabilities(report: Confinement) -> None:
    """Still root (no other id could be had): hold no capability at all."""
    libc = _libc()
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (fails past the last one: fine)
    header = struct.pack("II", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two empty {effective, permitted, inheritable} sets
    if libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data)) != 0:
        report.notes.append(f"capset: {os.strerror(ctypes.get_errno())}")


# ---- seccomp -----------------------------------------------------------------------------


class _Arch(NamedTuple):
    audit: int  # AUDIT_ARCH_*
    denied: tuple[int, ...]  # refused outright
    openat: tuple[int, int]  # its number, the index of its flags argument
    open: tuple[int, int] | None
    clone: int
    enosys: tuple[int, ...]  # calls whose arguments cannot be inspected: libc falls back


_X86_64 = _Arch(
    0xC000003E,
    # socket socketpair execve execveat fork vfork ptrace process_vm_readv/writev kill tkill
    # tgkill pidfd_send_signal/open/getfd creat open_by_handle_at mkdir mkdirat rmdir unlink
    # unlinkat rename renameat renameat2 link linkat symlink symlinkat chmod fchmod fchmodat
    # fchmodat2 chown fchown lchown fchownat truncate ftruncate mknod mknodat utime utimes
    # utimensat futimesat set/remove xattr (6) mount umount2 pivot_root chroot unshare setns
    # io_uring (3) bpf perf_event_open userfaultfd keyctl add_key request_key shmget msgget
    # semget mq_open personality open_tree move_mount fsopen fsconfig fsmount fspick
    # mount_setattr process_madvise memfd_secret
    (
        41, 53, 59, 322, 57, 58, 101, 310, 311, 62, 200, 234, 424, 434, 438, 85, 304, 83,
        258, 84, 87, 263, 82, 264, 316, 86, 265, 88, 266, 90, 91, 268, 452, 92, 93, 94, 260,
        76, 77, 133, 259, 132, 235, 280, 261, 188, 189, 190, 197, 198, 199, 165, 166, 155,
        161, 272, 308, 425, 426, 427, 321, 298, 323, 250, 248, 249, 29, 68, 64, 240, 135,
        428, 429, 430, 431, 432, 433, 442, 440, 447,
    ),
    (257, 2),
    (2, 1),
    56,
    (435, 437),  # clone3 openat2: their arguments cannot be inspected
)  # fmt: skip
_AARCH64 = _Arch(
    0xC00000B7,
    (
        198, 199, 221, 281, 117, 270, 271, 129, 130, 131, 424, 434, 438, 265, 34, 35, 38,
        276, 37, 36, 52, 53, 452, 54, 55, 45, 46, 33, 88, 5, 6, 7, 14, 15, 16, 40, 39, 41,
        51, 97, 268, 425, 426, 427, 280, 241, 282, 219, 217, 218, 194, 186, 190, 180, 92,
        428, 429, 430, 431, 432, 433, 442, 440, 447,
    ),
    (56, 2),
    None,
    220,
    (435, 437),
)  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CLONE_THREAD = 0x00010000
_LD, _JEQ, _JSET, _RET = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JSET|K, RET|K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000


def _filter(arch: _Arch) -> list[tuple[int, int, int, int]]:
    """The BPF program (``(code, jt, jf, k)`` instructions) for one architecture."""
    audit, denied, (openat, openat_arg), open_, clone, enosys = arch
    eperm = _ERRNO | errno.EPERM
    prog: list[tuple[int, int, int, int]] = [(_LD, 0, 0, 4)]  # seccomp_data.arch
    prog.append((_JEQ, 1, 0, audit))
    prog.append((_RET, 0, 0, eperm))  # another ABI (32-bit calls on a 64-bit kernel)
    prog.append((_LD, 0, 0, 0))  # seccomp_data.nr
    if audit == 0xC000003E:  # x32 calls carry bit 30
        prog.append((0x35, 0, 1, 0x40000000))  # JGE
        prog.append((_RET, 0, 0, eperm))
    for nr in denied:
        prog += [(_JEQ, 0, 1, nr), (_RET, 0, 0, eperm)]
    for nr in enosys:
        prog += [(_JEQ, 0, 1, nr), (_RET, 0, 0, _ERRNO | errno.ENOSYS)]
    # a call whose flags argument asks to write: refused; then reload nr for the next test
    checks = [(openat, openat_arg, _WRITE_FLAGS, eperm)]
    if open_ is not None:
        checks.append((open_[0], open_[1], _WRITE_FLAGS, eperm))
    for nr, arg, bits, verdict in checks:
        prog += [
            (_JEQ, 0, 4, nr),
            (_LD, 0, 0, 16 + 8 * arg),  # low 32 bits of args[arg] (little-endian)
            (_JSET, 0, 1, bits),
            (_RET, 0, 0, verdict),
            (_RET, 0, 0, _ALLOW),
        ]
    # clone without CLONE_THREAD is a new process: refused (threads are fine)
    prog += [
        (_JEQ, 0, 4, clone),
        (_LD, 0, 0, 16),
        (_JSET, 1, 0, _CLONE_THREAD),
        (_RET, 0, 0, eperm),
        (_RET, 0, 0, _ALLOW),
    ]
    prog.append((_RET, 0, 0, _ALLOW))
    return prog


@functools.cache
def _program(arch: _Arch) -> bytes:
    """The packed filter (computed once, in the zygote: see :func:`prepare`)."""
    return b"".join(struct.pack("HBBI", *ins) for ins in _filter(arch))


def _machine_arch() -> _Arch | None:
    machine = platform.machine().lower()
    arch = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}
    return arch.get(machine) if sys.byteorder == "little" else None


def prepare() -> set[int]:
    """What the zygote does once for its workers (and again after it imports more): load libc,
    pack the system-call filter, reroute the imports. Returns the descriptors workers keep."""
    _libc()
    arch = _machine_arch()
    if arch is not None:
        _program(arch)
    return reroute_imports()


def _seccomp(libc: ctypes.CDLL, report: Confinement) -> None:
    arch = _machine_arch()
    if arch is None:
        report.notes.append(f"seccomp: no filter for {platform.machine()}")
        return
    raw = _program(arch)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(raw) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        report.notes.append(f"seccomp: {os.strerror(ctypes.get_errno())}")
        return
    report.seccomp = True


# ---- all of it ---------------------------------------------------------------------------


def confine(
    keep_fd: int, *, memory_mb: int | None, workdir: str, parent_pid: int, cpu_s: int = 3600
) -> Confinement:
    """Confine this (freshly forked) worker; see the module docstring. Exits the process when
    the zygote (``parent_pid``) is already gone."""
    report = Confinement()
    libc = _libc()
    _close_descriptors({keep_fd, *_ROUTES.values()})
    _set_limits(memory_mb, cpu_s, report)
    _change_identity(report)
    _prctl(libc, _PR_SET_DUMPABLE, 0)
    if not _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1):
        report.notes.append("no_new_privs refused")
    # after the identity change: changing the uid clears the parent-death signal
    _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(0)
    try:
        os.chdir(workdir)
    except OSError:
        os.chdir("/")
    sys.dont_write_bytecode = True
    _seccomp(libc, report)
    return report


def keep_with_parent(memory_mb: int | None, parent_pid: int) -> None:
    """The unconfined worker (``GraderPool(confine=False)``): only the memory limit and the
    parent-death signal."""
    if memory_mb is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = memory_mb << 20
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    _prctl(_libc(), _PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(0)
