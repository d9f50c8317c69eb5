"""Code tools: ``python`` and ``bash`` running in the episode's sandbox, and the sandbox holder.

:class:`EpisodeSandbox` owns at most one sandbox at a time: it opens one on first use, closes it
when the episode ends (``close``), and closes it on garbage collection too, so a forgotten
environment never leaks a container. Tools take the holder, not a sandbox, because an
environment builds its tools before the episode's sandbox exists.

Each ``python`` call runs a fresh interpreter (state does not carry over between calls; files
in the work directory do). The model sees the exit status, stdout and stderr, capped.

>>> with EpisodeSandbox("process") as box:
...     print(PythonTool(box).call({"code": "print(6 * 7)"}))
exit code 0
stdout:
42
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from areal_agents.config import check_timeout
from areal_agents.errors import ConfigError, ToolError, ToolTimeout, did_you_mean
from areal_agents.sandboxes import BACKENDS, ExecResult, Sandbox, SandboxLimits, make_sandbox
from areal_agents.types import ToolSpec

__all__ = ["BashTool", "EpisodeSandbox", "PythonTool", "format_exec_result"]


def format_exec_result(result: ExecResult, max_chars: int = 2000) -> str:
    """What the model reads: the status line, then stdout and stderr (each capped)."""
    if result.timed_out:
        parts = ["timed out (the program was killed)"]
    elif result.oom_killed:
        parts = ["killed: out of memory"]
    else:
        parts = [f"exit code {result.exit_code}"]
    for name, stream in (("stdout", result.stdout), ("stderr", result.stderr)):
        if stream:
            cut = stream[:max_chars].rstrip("\n")
            more = len(stream) - max_chars
            parts.append(f"{name}:\n{cut}" + (f"\n...[{more} more characters]" if more > 0 else ""))
    if result.truncated:
        parts.append("[output truncated by the sandbox]")
    if result.ok and not result.stdout and not result.stderr:
        parts.append("(no output: use print() to see values)")
    return "\n".join(parts)


def _limit(own: float, budget: float | None) -> float:
    return own if budget is None else max(min(own, budget), 0.001)


def _report(result: ExecResult, max_chars: int, limit: float, own: float) -> str:
    """The model's view of a run; a run killed for time raises :class:`ToolTimeout` with it."""
    text = format_exec_result(result, max_chars)
    if not result.timed_out:
        return text
    if limit < own:
        text += f"\n(only {limit:.1f} s were left of this turn's tool time budget)"
    raise ToolTimeout(text)


def _close_quietly(sandbox: Sandbox) -> None:
    # at interpreter exit or in GC there is no one to report a failure to
    with contextlib.suppress(Exception):
        sandbox.close()


_DOCKER_OPTIONS = {"image": str, "pool_size": int}


def check_sandbox_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` for :func:`~areal_agents.sandboxes.make_sandbox`, checked now.

    Keys are :class:`~areal_agents.sandboxes.SandboxLimits` fields plus docker's ``image`` and
    ``pool_size``; an unknown key or a bad value is a ConfigError naming it, raised when the
    environment is built instead of as a tool failure in the first episode.
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"sandbox_options={options!r}: must be a dict of sandbox limits")
    out = dict(options)
    known = [f.name for f in dataclasses.fields(SandboxLimits)] + list(_DOCKER_OPTIONS)
    for key in out:
        if key not in known:
            raise ConfigError(
                f"sandbox_options: unknown option {key!r}{did_you_mean(str(key), known)}; "
                f"known: {', '.join(known)}"
            )
    limits = {k: v for k, v in out.items() if k not in _DOCKER_OPTIONS}
    for key, kind in _DOCKER_OPTIONS.items():
        value = out.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise ConfigError(f"sandbox_options[{key!r}]={value!r}: must be a {kind.__name__}")
    if isinstance(out.get("pool_size"), int) and out["pool_size"] < 1:
        raise ConfigError(f"sandbox_options['pool_size']={out['pool_size']}: must be at least 1")
    try:
        SandboxLimits.from_kwargs(limits)
    except ConfigError as e:
        raise ConfigError(f"sandbox_options: {e}") from None
    for key, value in limits.items():  # SandboxLimits takes any number; a bool or NaN is a typo
        if isinstance(value, bool) or value != value:
            raise ConfigError(f"sandbox_options[{key!r}]={value!r}: must be a positive number")
    return out


class EpisodeSandbox:
    """Opens a sandbox of ``backend`` on first :meth:`get`, and closes it on :meth:`close`
    (and when garbage-collected).

    Args:
        backend: ``"auto"``, ``"docker"``, ``"bubblewrap"`` or ``"process"``.
        options: passed to :func:`~areal_agents.sandboxes.make_sandbox` (limits such as
            ``memory_mb``, ``cpus``, ``pids``; docker's ``image``).
    """

    def __init__(self, backend: str = "auto", options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(backend, str) or backend not in BACKENDS:
            hint = did_you_mean(backend, BACKENDS) if isinstance(backend, str) else ""
            raise ConfigError(
                f"sandbox_backend={backend!r}{hint}: choose one of {', '.join(BACKENDS)}"
            )
        self.backend = backend
        self.options = check_sandbox_options(options)
        self._sandbox: Sandbox | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return self._sandbox is not None

    def get(self) -> Sandbox:
        """The episode's sandbox, opened now if needed (raises SandboxError if it cannot be)."""
        with self._lock:
            if self._sandbox is None:
                sandbox = make_sandbox(self.backend, **self.options)
                self._sandbox = sandbox
                self._finalizer = weakref.finalize(self, _close_quietly, sandbox)
            return self._sandbox

    def __call__(self) -> Sandbox:
        return self.get()

    def close(self) -> None:
        """Close the sandbox (if one is open); the next :meth:`get` opens a new one."""
        with self._lock:
            finalizer, self._finalizer, self._sandbox = self._finalizer, None, None
        if finalizer is not None:
            finalizer()

    def __enter__(self) -> EpisodeSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PythonTool:
    """``python(code)``: run a Python program in the episode's sandbox."""

    def __init__(
        self,
        sandbox: EpisodeSandbox,
        *,
        timeout_s: float = 10.0,
        max_output_chars: int = 2000,
        max_code_chars: int = 20000,
        name: str = "python",
    ) -> None:
        self.sandbox = sandbox
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self.max_output_chars = max_output_chars
        self.max_code_chars = max_code_chars
        self._spec = ToolSpec(
            name=name,
            description=(
                "Run a Python 3 program (standard library only) and return its exit status, "
                "stdout and stderr. Each call is a fresh process: print() what you need to see. "
                f"Time limit {timeout_s:g} s."
            ),
            parameters={
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the program"}},
                "required": ["code"],
                "additionalProperties": False,
            },
        )

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> str:
        """Run the program; ``timeout_s`` (what is left of the turn's budget) can only shorten
        the tool's own limit."""
        code = str(arguments["code"])
        if not code.strip():
            raise ToolError("the code is empty")
        if len(code) > self.max_code_chars:
            raise ToolError(f"the code is longer than {self.max_code_chars} characters")
        limit = _limit(self.timeout_s, timeout_s)
        result = self.sandbox.get().run_python(code, timeout=limit)
        return _report(result, self.max_output_chars, limit, self.timeout_s)


class BashTool:
    """``bash(command)``: run a shell command in the episode's sandbox work directory."""

    def __init__(
        self,
        sandbox: EpisodeSandbox,
        *,
        timeout_s: float = 10.0,
        max_output_chars: int = 2000,
        name: str = "bash",
    ) -> None:
        self.sandbox = sandbox
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self.max_output_chars = max_output_chars
        self._spec = ToolSpec(
            name=name,
            description=(
                "Run a shell command in the sandbox's work directory and return its exit "
                f"status, stdout and stderr. No network. Time limit {timeout_s:g} s."
            ),
            parameters={
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command"}},
                "required": ["command"],
                "additionalProperties": False,
            },
        )

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> str:
        """Run the command; ``timeout_s`` can only shorten the tool's own limit."""
        command = str(arguments["command"])
        if not command.strip():
            raise ToolError("the command is empty")
        limit = _limit(self.timeout_s, timeout_s)
        result = self.sandbox.get().run(command, timeout=limit)
        return _report(result, self.max_output_chars, limit, self.timeout_s)
