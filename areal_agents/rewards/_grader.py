"""The child side of :mod:`areal_agents.rewards.isolation`: the zygote and its workers.

The zygote is started with ``python -c`` (never ``multiprocessing``, which would re-run the
caller's ``__main__``), imports and warms the grading modules, then serves three requests on
its control socket: ``prepare`` (import a module and run its :func:`warm_up` hooks), ``fork``
(a worker; the caller's end of its socket pair goes back by ``SCM_RIGHTS``) and ``reap``
(kill and wait for workers, so that a worker's pid is never recycled while the caller may
still signal it). It exits, killing its workers, when the caller's end closes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import signal
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from typing import Any

__all__ = ["warm_up"]

logger = logging.getLogger(__name__)

_WARM_UPS: dict[str, list[Callable[[], object]]] = {}
_PREPARED: set[str] = set()  # in a zygote or worker: the modules imported and warmed


def warm_up(fn: Callable[[], object]) -> Callable[[], object]:
    """Register ``fn`` to run in the grading zygote once its module is imported there.

    Use it for one-off costs that would otherwise land inside a timed grade (building a
    parser, importing a verifier's data). It never runs in the calling process.
    """
    _WARM_UPS.setdefault(fn.__module__, []).append(fn)
    return fn


def _prepare(module: str) -> None:
    if module in _PREPARED:
        return
    importlib.import_module(module)
    for hook in _WARM_UPS.get(module, ()):
        try:
            hook()
        except Exception:  # a failed warm-up only costs time later
            logger.warning("grader warm-up %s failed", hook.__qualname__, exc_info=True)
    _PREPARED.add(module)


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


_LIBC: Any = None  # loaded once in the zygote, for prctl in its workers


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _worker_main(sock: socket.socket, zygote_pid: int, memory_mb: int | None) -> None:
    _die_with_parent()
    if os.getppid() != zygote_pid:  # the zygote died before prctl took effect
        return
    if memory_mb is not None:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = memory_mb << 20
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    conn = Connection(sock.detach())
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        reply: tuple[Any, ...]
        try:
            if request[0] == "prepare":
                _prepare(request[1])
                reply = ("ok", None)
            else:
                _, module, qualname, args, kwargs = request
                reply = ("ok", _resolve(module, qualname)(*args, **kwargs))
        except BaseException as e:  # every failure goes back to the caller
            reply = ("raised", e)
        try:
            conn.send(reply)
        except Exception as e:  # the value or the exception does not pickle
            what = reply[1]
            conn.send(("unpicklable", f"{type(what).__name__}: {what}"[:2000], repr(e)))


def _zygote_main(fd: int) -> None:
    """Entry point of the zygote process (see the module docstring)."""
    global _LIBC
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent to handle
    with contextlib.suppress(Exception):
        import ctypes

        _LIBC = ctypes.CDLL(None)
    conn = Connection(fd)
    children: set[int] = set()
    try:
        for module in json.loads(os.environ.get("AREAL_GRADER_PRELOAD", "[]")):
            _prepare(module)
        conn.send(("ready", os.getpid()))
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                return
            op = request[0]
            if op == "prepare":
                try:
                    _prepare(request[1])
                    conn.send(("ok", None))
                except Exception as e:
                    conn.send(("error", f"{type(e).__name__}: {e}"))
            elif op == "fork":
                parent_end, child_end = socket.socketpair()
                pid = os.fork()
                if pid == 0:  # the worker
                    try:
                        conn.close()
                        parent_end.close()
                        _worker_main(child_end, os.getppid(), request[1])
                    finally:
                        os._exit(0)
                child_end.close()
                children.add(pid)
                conn.send(("forked", pid))
                send_handle(conn, parent_end.fileno(), 0)
                parent_end.close()
            elif op == "reap":
                for pid in request[1]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        os.waitpid(pid, 0)
                    children.discard(pid)
    except (BrokenPipeError, ConnectionResetError):
        return  # the parent is gone (it exited while this process started): nothing to answer
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
