"""Killing every process of a sandbox's throw-away uid on the host (the caller must be root).

First a helper running as that uid calls ``kill(-1, SIGKILL)``: the kernel signals every process
the uid owns in one pass, wherever it sits in the process tree. A program of the uid can stop or
kill that helper before it acts (it is one of the uid's processes); then the host sweeps
``/proc`` and sends SIGKILL to each process whose real uid is the sandbox's, from root, which no
program of the uid can stop, until none is left.

The helper is started as root and drops to the uid itself (``setpriv``, or Python where
``setpriv`` is missing), after its ``exec``: a child that changed uid *before* exec could be
stopped by a program of the uid between fork and exec, and ``subprocess`` waits for that exec
with no time limit, so a stopping daemon would hang the caller for good.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

__all__ = ["kill_uid"]

log = logging.getLogger(__name__)

_KILL_HELPER_S = 1.0  # how long the kill(-1) helper may take before the /proc sweep takes over


def kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (needs root; ``uid`` must be a sandbox's own)."""
    # kill(-1) from a process of that uid signals every process it may signal: exactly the
    # sandbox's processes, wherever they are in the process tree, and never the caller itself.
    try:
        done = (
            subprocess.run(
                _helper(uid),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin"},
                check=False,
                timeout=_KILL_HELPER_S,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        done = False
    if not done:  # the helper was stopped or killed by a program of the uid: sweep from here
        _sweep_uid(uid)


def _helper(uid: int) -> list[str]:
    """A command, started as root, that becomes ``uid`` and sends SIGKILL to all it may signal."""
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
    if setpriv:
        ids = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        return [setpriv, *ids, "/bin/sh", "-c", "kill -9 -1 2>/dev/null; exit 0"]
    code = (
        "import os, signal\n"
        f"os.setgroups([]); os.setgid({uid}); os.setuid({uid})\n"
        "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
    )
    return [sys.executable, "-I", "-S", "-c", code]


def _uid_pids(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
        except OSError:
            continue
        state = fields.get(b"State", b" ?").split()[0]
        real = fields.get(b"Uid", b"-1").split()[0]
        if real == str(uid).encode() and state not in (b"Z", b"X"):
            pids.append(int(name))
    return pids


def _sweep_uid(uid: int, rounds: int = 20) -> None:
    """SIGKILL, from this (root) process, each process of ``uid`` until none is left."""
    for _ in range(rounds):
        pids = _uid_pids(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    log.warning("processes of sandbox uid %d survived %d rounds of SIGKILL", uid, rounds)
