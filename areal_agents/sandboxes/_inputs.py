"""What every backend checks before it runs or moves anything, so that all refuse alike.

Model-written text reaches a sandbox as a command, a program, stdin, a file's content or a path.
Text that no process could receive (a NUL byte in an argument, a lone surrogate that has no UTF-8
form) is refused the same way on every backend: a run returns an :class:`ExecResult` with exit
code 126 and the reason on stderr; a file operation raises :class:`ToolError`.

Paths of ``read_file``/``write_file`` follow one rule everywhere: relative to the work directory
(or absolute inside it), normalised lexically first, names of at most 255 bytes and paths of at
most 4095; after symlinks are resolved the file must still lie inside the work directory, and it
must be a regular file (FIFOs, sockets, devices and directories are refused at once, never
opened). The messages below are the ones every backend raises.
"""

from __future__ import annotations

import errno
import posixpath

from areal_agents.errors import ToolError
from areal_agents.sandboxes.base import ExecResult

__all__ = [
    "NAME_MAX",
    "PATH_MAX",
    "STDIN_CODE_LIMIT",
    "CommandRunner",
    "command_refusal",
    "encode_data",
    "os_problem",
    "problem",
    "work_relpath",
]

NAME_MAX = 255  # bytes in one path component (Linux)
PATH_MAX = 4095  # bytes in a path, without the terminating NUL
ARG_MAX_ONE = 131_071  # bytes in one argument of execve (MAX_ARG_STRLEN, without the NUL)
ARG_MAX_ALL = 2**21 - 2**16  # bytes of all arguments (ARG_MAX is 2 MiB; room for the env)
STDIN_CODE_LIMIT = 100_000  # bytes of source passed with -c; larger programs go through stdin

# Why a file operation was refused, by kind; {path} is the caller's path, repr'd.
_MESSAGES = {
    "outside": "path {path} leads outside the work directory",
    "workdir": "path {path} names the work directory itself",
    "missing": "no such file in the sandbox: {path}",
    "irregular": "path {path} is not a regular file (a directory, FIFO, socket or device)",
    "notdir": "path {path} runs through something that is not a directory",
    "space": "no space left in the sandbox to write {path}",
}


def problem(kind: str, path: str, detail: str = "") -> ToolError:
    """The :class:`ToolError` every backend raises for one kind of refused file operation."""
    template = _MESSAGES.get(kind)
    if template is None:
        return ToolError(f"cannot access {path!r}: {detail or kind}")
    return ToolError(template.format(path=repr(path)))


def os_problem(e: OSError, path: str, verb: str) -> ToolError:
    """The shared :class:`ToolError` for an ``OSError`` of a file operation on ``path``."""
    kind = {
        errno.ENOENT: "missing",
        errno.ENOTDIR: "notdir",
        errno.EEXIST: "notdir",
        errno.ENXIO: "irregular",
        errno.ENOSPC: "space",
        errno.EFBIG: "space",
        errno.EDQUOT: "space",
    }.get(e.errno or 0)
    if kind is not None:
        return problem(kind, path)
    return ToolError(f"cannot {verb} {path!r}: {e.strerror or e}")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolError(
            f"{what} is not valid UTF-8 text ({e.reason} at position {e.start})"
        ) from None


def encode_data(content: str | bytes, what: str = "content") -> bytes:
    """File content or stdin as bytes; text must have a UTF-8 form (no lone surrogates)."""
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content)
    if not isinstance(content, str):
        raise ToolError(f"{what} must be text or bytes, not {type(content).__name__}")
    return _utf8(content, what)


def work_relpath(path: str, work_path: str) -> str:
    """``path`` as a normalised path relative to the work directory ``work_path``.

    >>> work_relpath("/work/a/./b/../c.txt", "/work")
    'a/c.txt'
    >>> work_relpath("../etc/passwd", "/work")
    Traceback (most recent call last):
    ...
    areal_agents.errors.ToolError: path '../etc/passwd' leads outside the work directory
    """
    if not isinstance(path, str):
        raise ToolError(f"path must be text, not {type(path).__name__}")
    if "\x00" in path:
        raise ToolError(f"path {path[:80]!r} contains a NUL byte")
    raw = _utf8(path, "path")
    if len(raw) > PATH_MAX:
        raise ToolError(f"path of {len(raw)} bytes is longer than the limit of {PATH_MAX}")
    rel = path
    if path.startswith("/"):
        root = work_path.rstrip("/")
        if path != root and not path.startswith(root + "/"):
            raise ToolError(f"path {path!r} is outside the work directory {work_path}")
        rel = path[len(root) :].lstrip("/")
    norm = posixpath.normpath(rel) if rel else "."
    if norm == ".":
        raise problem("workdir", path)
    if norm == ".." or norm.startswith("../") or norm.startswith("/"):
        raise problem("outside", path)
    for part in norm.split("/"):
        if len(part.encode("utf-8")) > NAME_MAX:
            raise ToolError(
                f"path {path[:80]!r} has a name longer than the limit of {NAME_MAX} bytes"
            )
    return norm


def command_refusal(
    cmd: str | list[str] | None = None,
    *,
    code: str | None = None,
    stdin: str | bytes | None = None,
) -> ExecResult | None:
    """None when a command (or a program's ``code``) and ``stdin`` can be handed to a process,
    else the result to return instead of running anything.

    An argument with a NUL byte, without a UTF-8 form, or longer than the kernel takes cannot
    reach ``execve``; the caller gets exit code 126 with the reason on stderr, as a shell
    reports a command it cannot execute (the same on every backend, without starting anything).
    """
    parts: list[tuple[str, object]] = []
    if isinstance(cmd, str):
        parts.append(("the command", cmd))
    elif cmd is not None:
        parts += [(f"argument {i} of the command", a) for i, a in enumerate(cmd)]
    if code is not None:
        parts.append(("the program", code))
    if isinstance(stdin, str):
        parts.append(("stdin", stdin))
    total = 0
    for what, text in parts:
        reason = _text_problem(what, text, nul_ok=what == "stdin")
        if reason is None and what not in ("stdin", "the program"):  # long programs go by stdin
            size = len(str(text).encode("utf-8"))
            total += size + 1
            if size > ARG_MAX_ONE:
                reason = f"{what} is {size} bytes, longer than one argument may be ({ARG_MAX_ONE})"
            elif total > ARG_MAX_ALL:
                reason = f"the arguments are longer in all than the kernel allows ({ARG_MAX_ALL})"
        if reason is not None:
            return ExecResult(
                stdout="", stderr=f"sandbox: {reason}; nothing was run\n", exit_code=126
            )
    return None


def _text_problem(what: str, text: object, *, nul_ok: bool) -> str | None:
    if not isinstance(text, str):
        return f"{what} is a {type(text).__name__}, not text"
    if not nul_ok and "\x00" in text:
        if what == "the program":
            return "the program contains a NUL byte, which Python source code cannot contain"
        return f"{what} contains a NUL byte, which no program can receive as an argument"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"{what} is not valid UTF-8 text ({e.reason} at position {e.start})"
    return None


class CommandRunner:
    """``run`` and ``run_python`` as every backend has them, on top of its ``_run_argv``.

    Text no process could receive is refused (:func:`command_refusal`, once the sandbox is known
    to be open); a command string runs under ``/bin/sh -c``; a program runs with ``-c`` up to
    :data:`STDIN_CODE_LIMIT` bytes of source, and through stdin beyond that.
    """

    def _check_open(self) -> None:
        raise NotImplementedError

    def _python(self) -> str:
        """The interpreter that ``run_python`` starts inside the sandbox."""
        raise NotImplementedError

    def _run_argv(self, argv: list[str], timeout: float, stdin: bytes | None) -> ExecResult:
        raise NotImplementedError

    def run(
        self, cmd: str | list[str], *, timeout: float = 10.0, stdin: str | None = None
    ) -> ExecResult:
        refused = command_refusal(cmd, stdin=stdin)
        if refused is not None:
            self._check_open()
            return refused
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return self._run_argv(argv, timeout, stdin.encode() if stdin is not None else None)

    def run_python(self, code: str, *, timeout: float = 10.0) -> ExecResult:
        refused = command_refusal(code=code)
        if refused is not None:
            self._check_open()
            return refused
        source = code.encode()
        if len(source) <= STDIN_CODE_LIMIT:
            return self._run_argv([self._python(), "-c", code], timeout, None)
        return self._run_argv([self._python(), "-"], timeout, source)
