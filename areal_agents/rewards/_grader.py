"""The child side of :mod:`areal_agents.rewards.isolation`: the zygote and its workers.

The zygote is started with ``python -c`` (never ``multiprocessing``, which would re-run the
caller's ``__main__``) and an environment that holds none of the caller's variables. It
imports and warms the grading modules, then serves three requests on its control socket:
``prepare`` (import a module and run its :func:`warm_up` hooks), ``fork`` (a worker; the
caller's end of its socket pair goes back by ``SCM_RIGHTS``) and ``reap`` (kill and wait for
workers, so that a worker's pid is never recycled while the caller may still signal it). It
exits, killing its workers, when the caller's end closes.

A worker serves **one** grade (one job, or the rounds of one unit-test verdict: see
:meth:`~areal_agents.rewards._pool.GraderPool.session`) and is killed: nothing a grade does
(a patched module, a poisoned cache, a thread left running) can reach the next grade, which
runs in a fresh fork of the zygote. Before it reads its first job, a worker is confined
(:mod:`._confine`: its own uid, no writes, no new processes, no sockets, limits) and runs the
warm-up hooks again, so that the pages a grade touches are already its own copies. The
zygote keeps ``spares`` such workers forked ahead, so that a grade does not wait for a fork.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from typing import Any

from areal_agents.rewards._confine import confine, keep_with_parent, prepare
from areal_agents.rewards._harden import harden, install

__all__ = ["warm_up"]

logger = logging.getLogger(__name__)

_WARM_UPS: dict[str, list[Callable[[], object]]] = {}
_PREPARED: list[str] = []  # in a zygote or worker: the modules imported and warmed, in order
#: In a worker: what :func:`~areal_agents.rewards._confine.confine` put in force (for tests).
CONFINEMENT: Any = None


def warm_up(fn: Callable[[], object]) -> Callable[[], object]:
    """Register ``fn`` to run in the grading zygote once its module is imported there (and in
    each worker before its job).

    Use it for one-off costs that would otherwise land inside a timed grade (building a
    parser, importing a verifier's data). It never runs in the calling process. It must be
    safe to run again (every worker repeats it on trusted inputs).
    """
    _WARM_UPS.setdefault(fn.__module__, []).append(fn)
    return fn


def _run_hooks(module: str) -> None:
    for hook in _WARM_UPS.get(module, ()):
        try:
            hook()
        except Exception:  # a failed warm-up only costs time later
            logger.warning("grader warm-up %s failed", hook.__qualname__, exc_info=True)


def _prepare(module: str) -> None:
    if module in _PREPARED:
        return
    importlib.import_module(module)
    harden()  # before any hook: warm-ups run grades too
    _run_hooks(module)
    _PREPARED.append(module)


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker_main(sock: socket.socket, zygote_pid: int, config: dict[str, Any]) -> None:
    global CONFINEMENT
    if config.get("confine", True):
        CONFINEMENT = confine(
            sock.fileno(),
            memory_mb=config.get("memory_mb"),
            workdir=config["workdir"],
            parent_pid=zygote_pid,
        )
    else:
        keep_with_parent(config.get("memory_mb"), zygote_pid)
    conn = Connection(sock.detach())
    for module in _PREPARED:  # trusted inputs: fault in the pages a grade will touch
        _run_hooks(module)
    while True:  # the jobs of one grade (the caller never sends another grade's)
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        reply: tuple[Any, ...]
        try:
            _, module, qualname, args, kwargs = request
            fn = _resolve(module, qualname)
            harden()
            reply = ("ok", fn(*args, **kwargs))
        except BaseException as e:  # every failure goes back to the caller
            reply = ("raised", e)
        try:
            conn.send(reply)
        except Exception as e:  # the value or the exception does not pickle
            what = reply[1]
            try:
                text = f"{type(what).__name__}: {what}"[:2000]
            except Exception:
                text = type(what).__name__
            conn.send(("unpicklable", text, repr(e)[:500]))


class _Zygote:
    def __init__(self, conn: Connection, config: dict[str, Any]) -> None:
        self.conn = conn
        self.config = config
        self.children: set[int] = set()
        self.dying: set[int] = set()  # killed, not reaped yet
        self.spares: list[tuple[int, socket.socket]] = []

    def fork(self) -> tuple[int, socket.socket]:
        parent_end, child_end = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                self.conn.close()
                parent_end.close()
                for _, other in self.spares:
                    other.close()
                _worker_main(child_end, os.getppid(), self.config)
            finally:
                os._exit(0)
        child_end.close()
        self.children.add(pid)
        return pid, parent_end

    def refill(self) -> None:
        while len(self.spares) < int(self.config.get("spares", 1)):
            self.spares.append(self.fork())

    def drop_spares(self) -> None:
        spares, self.spares = self.spares, []
        for pid, end in spares:
            end.close()
            self.reap([pid])

    def reap(self, pids: list[int], *, wait: bool = False) -> None:
        """Kill ``pids`` (still this process's children, so never a recycled pid) and wait
        for them, now (``wait``) or, not to hold up a reply, from a later request on."""
        for pid in pids:
            if pid in self.children:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                self.dying.add(pid)
        for pid in list(self.dying):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, 0 if wait else os.WNOHANG)[0] == 0:
                    continue
            self.dying.discard(pid)
            self.children.discard(pid)

    def freeze(self) -> None:
        if self.config.get("confine", True):
            prepare()  # once per import: what every worker's confinement needs
        gc.collect()
        gc.freeze()  # the workers' collector leaves the zygote's objects (and pages) alone

    def serve(self) -> None:
        for module in self.config.get("preload", []):
            _prepare(module)
        self.freeze()
        self.conn.send(("ready", os.getpid()))
        self.refill()
        while True:
            try:
                request = self.conn.recv()
            except (EOFError, OSError):
                return
            op = request[0]
            if op == "prepare":
                try:
                    fresh = request[1] not in _PREPARED
                    _prepare(request[1])
                    self.conn.send(("ok", None))
                except Exception as e:
                    self.conn.send(("error", f"{type(e).__name__}: {e}"))
                    continue
                if fresh:  # the spares were forked without it
                    self.freeze()
                    self.drop_spares()
                    self.refill()
            elif op == "fork":
                pid, end = self.spares.pop(0) if self.spares else self.fork()
                self.conn.send(("forked", pid))
                send_handle(self.conn, end.fileno(), pid)
                end.close()
                self.refill()
            elif op == "reap":
                self.reap(request[1])
            self.reap([])


def _zygote_main(fd: int) -> None:
    """Entry point of the zygote process (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent to handle
    install()  # before any import of a grader: every guarded module is guarded as it loads
    config: dict[str, Any] = json.loads(os.environ.get("AREAL_GRADER_CONFIG", "{}"))
    workdir = tempfile.mkdtemp(prefix="areal-grader-")
    os.chmod(workdir, 0o555)  # empty, and nobody may write to it
    config["workdir"] = workdir
    zygote = _Zygote(Connection(fd), config)
    try:
        zygote.serve()
    except (BrokenPipeError, ConnectionResetError):
        return  # the parent is gone (it exited while this process started): nothing to answer
    finally:
        for _, end in zygote.spares:
            end.close()
        zygote.reap(list(zygote.children), wait=True)
        shutil.rmtree(workdir, ignore_errors=True)
