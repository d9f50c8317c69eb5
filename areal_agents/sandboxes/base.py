"""The Sandbox contract: run commands and programs in isolation, move files, reset, close.

Backends (``docker``, ``bubblewrap``, ``process``) implement :class:`Sandbox`; callers get one
from ``make_sandbox``. Every run returns an :class:`ExecResult`; a program that fails, times
out or runs out of memory is a *result*, not an exception. Only a broken sandbox (daemon gone,
container died) raises :class:`~areal_agents.errors.SandboxError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["ExecResult", "Sandbox"]


@dataclass(frozen=True)
class ExecResult:
    """What one command did inside a sandbox.

    ``stdout``/``stderr`` are decoded with replacement characters and capped; ``truncated`` says
    whether either was cut. ``exit_code`` is the process's status (negative or 128+N for a
    signal, as the backend reports it); ``timed_out`` and ``oom_killed`` say why it was killed.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the program exited 0 on its own."""
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed

    def summary(self, limit: int = 2000) -> str:
        """A short text for a model to read: status line, then stdout and stderr."""
        if self.timed_out:
            status = "timed out"
        elif self.oom_killed:
            status = "killed: out of memory"
        else:
            status = f"exit code {self.exit_code}"
        parts = [status]
        if self.stdout:
            parts.append("stdout:\n" + self.stdout[:limit])
        if self.stderr:
            parts.append("stderr:\n" + self.stderr[:limit])
        if self.truncated:
            parts.append("[output truncated]")
        return "\n".join(parts)


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run model-written code, alive for one episode."""

    def run(
        self, cmd: str | list[str], *, timeout: float = 10.0, stdin: str | None = None
    ) -> ExecResult:
        """Run a shell command (str) or an argv list in the work directory."""
        ...

    def run_python(self, code: str, *, timeout: float = 10.0) -> ExecResult:
        """Run a Python program given as source text."""
        ...

    def write_file(self, path: str, content: str | bytes) -> None:
        """Write a file, relative to the work directory."""
        ...

    def read_file(self, path: str) -> bytes:
        """Read a file, relative to the work directory."""
        ...

    def reset(self) -> None:
        """Return to a clean state: empty work directory, no leftover processes."""
        ...

    def close(self) -> None:
        """Release the sandbox; it cannot be used afterwards. Safe to call twice."""
        ...
