"""The shared file helpers: atomic writes, JSON lines (strict and torn-tolerant), directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from areal_agents.errors import ConfigError
from areal_agents.files import atomic_directory, atomic_write, read_jsonl, write_json
from areal_agents.net import free_port


def test_atomic_write_replaces_whole_files_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "f.txt"
    atomic_write(path, "one")
    atomic_write(path, b"two")
    assert path.read_text() == "two"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)

    class Boom(Exception):
        pass

    class Exploding(str):
        def encode(self, *args: object, **kwargs: object) -> bytes:
            raise Boom

    with pytest.raises(Boom):
        atomic_write(path, Exploding("three"))
    assert path.read_text() == "two"  # the old content survives a failed write
    assert sorted(os.listdir(path.parent)) == ["f.txt"]  # no temporary file left behind


def test_read_jsonl_strict_for_user_data_and_torn_ok_for_logs(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    assert read_jsonl(path, torn_ok=True) == []
    with pytest.raises(ConfigError, match="does not exist"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n\n[1]\n{"a": 2}\n{"a": ')
    assert read_jsonl(path, torn_ok=True) == [{"a": 1}, {"a": 2}]
    with pytest.raises(ConfigError, match=r"rows\.jsonl:3: each line must be a JSON object"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n{"b": 2}\n')
    with pytest.raises(ConfigError, match=r":2: missing key\(s\) \['a'\]"):
        read_jsonl(path, required=("a",))
    path.write_text("\n")
    with pytest.raises(ConfigError, match="holds no rows"):
        read_jsonl(path)
    write_json(tmp_path / "x.json", {"k": [1, 2]}, indent=2)
    assert (tmp_path / "x.json").read_text().endswith("}\n")


def test_atomic_directory_publishes_once_and_keeps_a_winner(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model"

    def complete(p: Path) -> bool:
        return (p / "done").is_file()

    target.mkdir(parents=True)  # a broken leftover (no stamp) is replaced
    with atomic_directory(target, is_complete=complete) as work:
        assert not complete(target)
        (work / "done").write_text("1")
    assert complete(target) and sorted(os.listdir(target.parent)) == ["model"]

    with atomic_directory(target, is_complete=complete) as work:  # another process won
        (work / "mine").write_text("1")
    assert not (target / "mine").exists()
    assert sorted(os.listdir(target.parent)) == ["model"]

    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "other", is_complete=complete):
        raise RuntimeError("the build failed")
    assert not (tmp_path / "other").exists()
    assert sorted(os.listdir(tmp_path)) == ["cache"]


def test_free_port_is_bindable_on_loopback() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
