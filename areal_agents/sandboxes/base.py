"""The Sandbox contract: run commands and programs in isolation, move files, reset, close.

Backends (``docker``, ``bubblewrap``, ``process``) implement :class:`Sandbox`; callers get one
from ``make_sandbox``. Every run returns an :class:`ExecResult`; a program that fails, times
out or runs out of memory is a *result*, not an exception, and so is a command that cannot be
started at all (a NUL byte or text without a UTF-8 form in it: exit code 126). A file operation
the model asked for wrongly raises :class:`~areal_agents.errors.ToolError`, with the same words
on every backend. Only a broken sandbox (daemon gone, container died) raises
:class:`~areal_agents.errors.SandboxError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from areal_agents.errors import ConfigError, did_you_mean

__all__ = ["BaseSandbox", "ExecResult", "Sandbox", "SandboxLimits"]


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
        """Write a file, relative to the work directory (missing directories are created).

        Raises ToolError, never blocking, when the path leads outside the work directory (also
        through a symlink), names something that is not a regular file (a FIFO, socket or
        directory), or the content does not fit in the disk limit."""
        ...

    def read_file(self, path: str) -> bytes:
        """Read a file, relative to the work directory; ToolError as for :meth:`write_file`,
        or when there is no such file."""
        ...

    def reset(self) -> None:
        """Return to a clean state: an empty work directory with its original mode, times and
        no extended attributes, no leftover processes, IPC objects or temporary files."""
        ...

    def close(self) -> None:
        """Release the sandbox; it cannot be used afterwards. Safe to call twice."""
        ...


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits every backend applies (as far as its mechanism allows; see each backend).

    >>> SandboxLimits(memory_mb=128).memory_mb
    128
    >>> SandboxLimits.from_kwargs({"memroy_mb": 1})
    Traceback (most recent call last):
    ...
    areal_agents.errors.ConfigError: unknown sandbox limit 'memroy_mb' (did you mean 'memory_mb'?)
    """

    memory_mb: int = 512
    """Memory (docker: cgroup memory + swap; local backends: address space per process)."""
    cpus: float = 1.0
    """CPU share (docker: CPU quota in cores; local backends: not enforced, see cpu_time)."""
    pids: int = 64
    """Processes and threads at once (docker: pids cgroup; local backends: RLIMIT_NPROC)."""
    disk_mb: int = 64
    """Work directory size (docker: tmpfs size) and largest file (RLIMIT_FSIZE elsewhere)."""
    max_output_bytes: int = 64 * 1024
    """Bytes of stdout and of stderr kept per call; the rest is dropped and ``truncated`` set."""
    open_files: int = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"sandbox limit {f.name}={value!r} must be a positive number")

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> SandboxLimits:
        """Build limits from keyword arguments, naming any unknown key."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in names:
                raise ConfigError(f"unknown sandbox limit {key!r}{did_you_mean(key, names)}")
        return cls(**kwargs)


class BaseSandbox:
    """Shared behaviour of the backends: context manager and ``asyncio`` variants.

    The ``a*`` methods run the blocking call in a worker thread (``asyncio.to_thread``), so a
    coroutine that drives many episodes never blocks its event loop on a sandbox.
    Subclasses implement the synchronous :class:`Sandbox` methods.
    """

    backend: str = "base"

    def run(
        self, cmd: str | list[str], *, timeout: float = 10.0, stdin: str | None = None
    ) -> ExecResult:
        raise NotImplementedError

    def run_python(self, code: str, *, timeout: float = 10.0) -> ExecResult:
        raise NotImplementedError

    def write_file(self, path: str, content: str | bytes) -> None:
        raise NotImplementedError

    def read_file(self, path: str) -> bytes:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> BaseSandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> BaseSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def arun(
        self, cmd: str | list[str], *, timeout: float = 10.0, stdin: str | None = None
    ) -> ExecResult:
        """:meth:`run` in a worker thread."""
        return await asyncio.to_thread(self.run, cmd, timeout=timeout, stdin=stdin)

    async def arun_python(self, code: str, *, timeout: float = 10.0) -> ExecResult:
        """:meth:`run_python` in a worker thread."""
        return await asyncio.to_thread(self.run_python, code, timeout=timeout)

    async def awrite_file(self, path: str, content: str | bytes) -> None:
        """:meth:`write_file` in a worker thread."""
        await asyncio.to_thread(self.write_file, path, content)

    async def aread_file(self, path: str) -> bytes:
        """:meth:`read_file` in a worker thread."""
        return await asyncio.to_thread(self.read_file, path)

    async def areset(self) -> None:
        """:meth:`reset` in a worker thread."""
        await asyncio.to_thread(self.reset)

    async def aclose(self) -> None:
        """:meth:`close` in a worker thread."""
        await asyncio.to_thread(self.close)
