"""File helpers every layer shares: atomic writes that survive a crash, JSON and JSON lines.

A file written by :func:`atomic_write` holds either its old content or all of the new one,
whatever moment a ``kill -9`` or a power cut lands: the data goes to a temporary file in the
same directory, is flushed and fsynced, renamed over the target, and the directory is fsynced
so that the rename itself is on disk. :func:`atomic_directory` does the same for a directory
built in place (a converted model, a search index): it appears complete or not at all.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> write_json(root / "a" / "state.json", {"step": 3})
>>> read_json(root / "a" / "state.json")
{'step': 3}
>>> _ = (root / "log.jsonl").write_text('{"step": 1}\\n{"step": 2}\\n{"st')  # a torn last line
>>> read_jsonl(root / "log.jsonl", torn_ok=True)
[{'step': 1}, {'step': 2}]
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_agents.errors import ConfigError

__all__ = [
    "atomic_directory",
    "atomic_write",
    "fsync_directory",
    "json_text",
    "read_json",
    "read_jsonl",
    "write_json",
]

PathLike = str | os.PathLike[str]

_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(value: Any, **kwargs: Any) -> str:
    r"""``json.dumps(value, ensure_ascii=False, **kwargs)`` whose text always encodes as UTF-8.

    A Python string may hold lone surrogates (``"\ud800"``: ``json.loads`` of an escaped one, a
    ``surrogateescape`` decode, a program's output); UTF-8 cannot encode them, so writing such
    text fails. Here each one becomes the JSON escape ``\uXXXX``, which reads back as the same
    string: any text is escaped, never fatal.

    >>> json_text({"a": "\ud800 é"})
    '{"a": "\\ud800 é"}'
    >>> json.loads(json_text(["\udfff"])) == ["\udfff"]
    True
    """
    text = json.dumps(value, ensure_ascii=False, **kwargs)
    try:
        text.encode()
    except UnicodeEncodeError:  # a surrogate only ever stands inside a JSON string: escape it
        text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


def fsync_directory(path: PathLike) -> None:
    """Make the entries of directory ``path`` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: PathLike, data: str | bytes, *, mode: int = 0o644) -> None:
    """Replace the file ``path`` with ``data`` atomically and durably (parents are created).

    ``mode`` is the new file's permission bits (a temporary file starts private). Text is
    written as UTF-8; a code point UTF-8 cannot encode (a lone surrogate) is written as its
    backslash escape instead of failing the write.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode(errors="backslashreplace") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)


def write_json(path: PathLike, data: Any, *, indent: int | None = None) -> None:
    """Write ``data`` as JSON with :func:`atomic_write`."""
    atomic_write(path, json.dumps(data, indent=indent) + ("\n" if indent is not None else ""))


def read_json(path: PathLike) -> Any:
    """The JSON value stored at ``path``."""
    with open(path) as f:
        return json.load(f)


def read_jsonl(
    path: PathLike, *, required: Sequence[str] = (), torn_ok: bool = False
) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file (``.gz`` allowed), one per non-empty line.

    ``torn_ok=False`` (data a user gave): a missing or empty file, a line that is not valid
    JSON, not an object, or lacks one of the ``required`` keys raises
    :class:`~areal_agents.errors.ConfigError` naming the file and line.
    ``torn_ok=True`` (a log this package appends to): a missing file reads as empty, and a line
    that does not parse (the last one, cut by a crash) is skipped.
    """
    path = Path(path)
    if not path.is_file():
        if torn_ok:
            return []
        raise ConfigError(f"JSONL file {str(path)!r} does not exist")
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    rows: list[dict[str, Any]] = []
    # A torn last line may end inside a UTF-8 sequence: in a log, decode it leniently.
    errors = "replace" if torn_ok else "strict"
    with opener(path, "rt", encoding="utf-8", errors=errors) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if torn_ok:
                    continue
                raise ConfigError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, Mapping):
                if torn_ok:
                    continue
                raise ConfigError(f"{path}:{n}: each line must be a JSON object")
            missing = [k for k in required if k not in row]
            if missing:
                raise ConfigError(f"{path}:{n}: missing key(s) {missing}; found {sorted(row)}")
            rows.append(dict(row))
    if not rows and not torn_ok:
        raise ConfigError(f"JSONL file {str(path)!r} holds no rows")
    return rows


@contextlib.contextmanager
def atomic_directory(target: PathLike, *, is_complete: Callable[[Path], bool]) -> Iterator[Path]:
    """Build a directory in a fresh temporary one, then publish it at ``target`` by a rename.

    Yields the temporary directory (next to ``target``, so the rename is atomic). On a normal
    exit it becomes ``target``; a leftover ``target`` that ``is_complete`` rejects is removed
    first, and when another process published a complete ``target`` first, theirs is kept. The
    temporary directory is gone afterwards in every case.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield work
        work.chmod(0o755)  # mkdtemp makes it private; a cache is shared like any directory
        if target.exists() and not is_complete(target):
            shutil.rmtree(target, ignore_errors=True)  # a broken leftover
        try:
            os.rename(work, target)
        except OSError:
            if not is_complete(target):  # not a lost race: a real failure
                raise
        fsync_directory(target.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
