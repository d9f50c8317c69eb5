"""The plain process backend: rlimits and a private work directory, and nothing else.

This is **not isolation**: the program shares the host's network, file system view and process
table. It exists so that code runs on machines with neither Docker nor bubblewrap (a laptop, a
restricted CI runner); :func:`~areal_agents.sandboxes.make_sandbox` warns once when it falls
back to it. When the host process is root, programs run under a throw-away uid (see
``_local``), which keeps root-only files unreadable and makes the process limit bind.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings

from areal_agents.sandboxes._local import LocalSandbox, runnable_python
from areal_agents.sandboxes.base import SandboxLimits

__all__ = ["ProcessSandbox", "warn_not_isolated"]

_warned = False


def warn_not_isolated() -> None:
    """Warn, once per process, that the process backend does not isolate anything."""
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        "areal_agents: no Docker engine or bubblewrap here; sandboxed code runs as plain host "
        "processes with rlimits only. This is NOT isolation: do not run untrusted code like this "
        "(run `python -m areal_agents.sandbox doctor` to see why the other backends fail).",
        RuntimeWarning,
        stacklevel=3,
    )


class ProcessSandbox(LocalSandbox):
    """Programs as host subprocesses in a temporary work directory, under rlimits.

    >>> with ProcessSandbox() as sb:
    ...     sb.write_file("a.txt", "hi")
    ...     sb.run("cat a.txt").stdout
    'hi'
    """

    backend = "process"

    def __init__(self, limits: SandboxLimits | None = None, python: str | None = None) -> None:
        super().__init__(limits)
        self.work_path = str(self.work_dir)
        self._py = python

    def _wrap(self, argv: list[str]) -> list[str]:
        return argv

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.work_dir),
            "TMPDIR": str(self.work_dir),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def _python(self) -> str:
        if self._py is None:
            candidates = (sys.executable, "/usr/bin/python3", shutil.which("python3") or "")
            self._py = runnable_python(self.uid, candidates)
        return self._py


if os.name != "posix":  # pragma: no cover
    raise ImportError("the process sandbox needs a POSIX system")
