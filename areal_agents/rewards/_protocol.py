"""The caller's half of the wire to the grading processes (:mod:`._grader` is the other half).

* **launching the zygote** (:func:`launch_zygote`): ``python -c`` with a control socket and an
  environment that holds none of the caller's variables (API keys, tokens), only a few
  harmless ones and the thread settings; :data:`DEFAULT_PRELOAD` are the modules it imports
  and warms unless told otherwise;
* **a worker's handle** (``_Worker``): its pid, its end of the socket pair and a pidfd, so
  that killing it never hits a recycled pid;
* **a job** names its function by module and qualified name (``_reference`` checks that the
  name leads back to the same function, so that the worker runs what the caller meant);
* **a reply** is size-capped (:data:`MAX_REPLY_BYTES`) and unpickled with an allow-list
  (``_load_reply``): a worker that model text took over cannot make the caller run anything
  by what it sends back; its values reach messages only through ``_shown``, which never
  raises;
* **the errors** of a grade that could not be had: :class:`GraderUnavailable` (an
  infrastructure fault) and :class:`GradingFailed` (caused by the input).

:class:`~areal_agents.rewards._pool.GraderPool` drives them (and runs one grade's jobs in one
worker, :class:`~areal_agents.rewards._pool.GradingSession`); :mod:`.isolation` has the
overview.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from areal_agents.errors import ConfigError, InfrastructureError
from areal_agents.rewards._grader import _resolve
from areal_agents.rewards._safe_text import safe_text

__all__ = [
    "DEFAULT_PRELOAD",
    "MAX_REPLY_BYTES",
    "GraderUnavailable",
    "GradingFailed",
    "launch_zygote",
]

#: Modules every zygote imports (and warms) before it says it is ready.
DEFAULT_PRELOAD = ("areal_agents.rewards.math",)
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
    "from areal_agents.rewards._grader import _zygote_main; _zygote_main(int(sys.argv[1]))"
)
#: The only variables of the caller that the grading processes see.
_PASSED_ENV = frozenset(
    {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONHASHSEED"}
)
# Native thread pools and fork() do not mix: the zygote keeps every library single-threaded.
_SINGLE_THREADED = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}


class GraderUnavailable(InfrastructureError):
    """No grading worker could be started or freed in time (the answer was not graded)."""


class GradingFailed(RuntimeError):
    """The grader could not finish on this input: its process died or ran out of memory.

    Caused by the input (a memory bomb, a crash in a parser), so rewards report it as the
    status ``"error"``, not as an infrastructure fault.
    """


# ---- the zygote and its workers ----------------------------------------------------------


def launch_zygote(config: Mapping[str, Any]) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start a grading zygote with ``config`` (``preload``, ``memory_mb``, ``confine``,
    ``spares``): its process and the caller's end of its control socket.

    Raises :class:`GraderUnavailable` when the process cannot be started.
    """
    parent_end, child_end = socket.socketpair()
    # none of the caller's variables (API keys, tokens) reach the grading processes
    env = {k: v for k, v in os.environ.items() if k in _PASSED_ENV}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(_SINGLE_THREADED, AREAL_GRADER_CONFIG=json.dumps(config))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(child_end.fileno()), json.dumps(sys.path)],
            pass_fds=(child_end.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
        )
    except OSError as e:
        parent_end.close()
        raise GraderUnavailable(f"cannot start the grading process: {e}") from e
    finally:
        child_end.close()
    return proc, Connection(parent_end.detach())


@dataclass(eq=False)
class _Worker:
    pid: int
    conn: Connection
    pidfd: int | None
    modules: set[str] = field(default_factory=set)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        self.conn.close()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


# ---- a job and its reply -----------------------------------------------------------------


@functools.cache
def _reference(fn: Callable[..., Any]) -> tuple[str, str]:
    module = getattr(fn, "__module__", None) or ("builtins" if callable(fn) else None)
    qualname = getattr(fn, "__qualname__", None)
    problem = None
    if not module or not qualname or "<" in qualname or module == "__main__":
        problem = "it must be a function defined at module level in an importable module"
    else:
        try:
            found = _resolve(module, qualname)
        except (ImportError, AttributeError) as e:
            problem = f"{module}.{qualname} cannot be imported ({e})"
        else:
            if found is not fn:
                problem = f"{module}.{qualname} names another object"
    if problem is not None:
        raise ConfigError(f"cannot run {fn!r} in a grading process: {problem}")
    return module, qualname  # type: ignore[return-value]


def _shown(value: Any) -> str:
    """A value a worker sent, for a message: never raises (a huge int, a deep list), always
    valid UTF-8, at most 500 characters."""
    try:
        text = value if type(value) is str else repr(value)
    except BaseException:
        text = f"<{type(value).__name__}>"
    return safe_text(text)


def _healthy_after(error: Any) -> bool:
    """Whether a worker whose job raised ``error`` may serve the same grade's next job."""
    return isinstance(error, Exception) and not isinstance(error, MemoryError | RecursionError)


#: Largest reply a worker may send (a larger one is a grading failure).
MAX_REPLY_BYTES = 64 << 20
# Classes a reply may name, besides every exception class of these modules (a worker's reply is
# unpickled here, so it may name nothing whose construction does more than hold data).
_REPLY_CLASSES = {
    ("builtins", "complex"),
    ("areal_agents.rewards._judge", "Round"),
    ("areal_agents.rewards._calls", "Call"),
    ("areal_agents.rewards.base", "RewardResult"),
}
_EXCEPTION_MODULES = ("builtins", "areal_agents.errors")


class _ReplyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _REPLY_CLASSES or module in _EXCEPTION_MODULES:
            found = super().find_class(module, name)
            allowed = (module, name) in _REPLY_CLASSES or (
                isinstance(found, type) and issubclass(found, BaseException)
            )
            if allowed:
                return found
        raise pickle.UnpicklingError(f"a grading reply may not name {module}.{name}"[:200])


def _load_reply(data: bytes) -> tuple[Any, ...]:
    """A worker's reply, unpickled with nothing but plain data, the reply classes and
    exceptions allowed: a worker that model text took over cannot make this process run
    anything by what it sends back."""
    reply = _ReplyUnpickler(io.BytesIO(data)).load()
    if not isinstance(reply, tuple) or len(reply) < 2 or reply[0] not in _REPLY_STATUSES:
        raise pickle.UnpicklingError("not a grading reply")
    return reply


_REPLY_STATUSES = ("ok", "raised", "unpicklable")


def _resource(error: BaseException) -> str:
    return "memory" if isinstance(error, MemoryError) else "stack (nesting too deep)"


# ---- one grade's jobs in one worker ------------------------------------------------------


class _Raised(Exception):
    """The job's own exception, with the worker that may be kept (internal to a session)."""

    def __init__(self, worker: _Worker | None, error: Exception) -> None:
        super().__init__(error)
        self.worker, self.error = worker, error
