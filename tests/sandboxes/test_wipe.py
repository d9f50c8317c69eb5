"""Measuring and removing trees of any depth without recursion, never following a symlink."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import pytest

from areal_agents.sandboxes._wipe import clear_dir, disk_usage, remove_tree

DEPTH = 400  # deeper than the recursion limit below; its paths (5 KB) outgrow PATH_MAX


def _deep(root: Path, depth: int = DEPTH, name: str = "d" * 12) -> None:
    fd = os.open(root, os.O_RDONLY)
    try:
        for i in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
            if i % 80 == 0:
                with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "wb") as f:
                    f.write(b"x" * 5000)
    finally:
        os.close(fd)


@pytest.fixture
def low_recursion_limit():
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)  # a walk recursing per level would fail
    yield
    sys.setrecursionlimit(old)


def test_a_deep_tree_is_measured_and_removed_without_recursion(
    tmp_path: Path, low_recursion_limit: None
):
    (tmp_path / "t").mkdir()
    _deep(tmp_path / "t")
    assert disk_usage(tmp_path) >= 5 * 5000  # the files at every 80th level are all counted
    remove_tree(tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_unreadable_directories_are_cleared(tmp_path: Path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    (tmp_path / "a" / "b").chmod(0)
    (tmp_path / "a").chmod(0o500)
    assert clear_dir(tmp_path) == 0
    assert list(tmp_path.iterdir()) == []


def test_symlinks_are_removed_never_followed(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep me" * 100_000)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(outside)
    (tree / "file_link").symlink_to(outside / "keep.txt")
    assert disk_usage(tree) < 100_000  # the 700 KB file behind the links is not counted
    remove_tree(tree)
    assert not tree.exists() and (outside / "keep.txt").stat().st_size == 700_000


def test_special_files_and_hard_links(tmp_path: Path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"x" * 100_000)
    for i in range(5):
        os.link(tmp_path / "big", tmp_path / f"link{i}")
    assert disk_usage(tmp_path) < 2 * 100_000 + 8192  # hard links counted once
    assert clear_dir(tmp_path) == 0  # the FIFO is unlinked, never opened


def test_a_missing_tree_is_nothing(tmp_path: Path):
    assert disk_usage(tmp_path / "nope") == 0
    remove_tree(tmp_path / "nope")


def test_a_branching_tree_deeper_than_the_open_directories_is_counted_exactly(tmp_path: Path):
    chain = tmp_path
    for level in range(150):  # a chain past _KEEP_FDS, with a side branch every 7 levels
        chain = chain / f"c{level}"
        chain.mkdir()
        (chain / "f").write_bytes(b"x" * (level * 61 % 9000 + 1))
        if level % 7 == 0:
            side = chain / "side"
            for depth in range(4):
                side = side / f"s{depth}"
                side.mkdir(parents=True)
                (side / "g").write_bytes(b"y" * (depth * 977 + 1))
    expected = 0
    for root, subdirs, files in os.walk(tmp_path):
        for name in subdirs + files:
            expected += os.lstat(os.path.join(root, name)).st_blocks * 512
    assert disk_usage(tmp_path) == expected
    assert clear_dir(tmp_path) == 0 and list(tmp_path.iterdir()) == []


def test_the_container_reset_refuses_to_run_as_root(monkeypatch: pytest.MonkeyPatch):
    from areal_agents.sandboxes import _wipe

    killed = []
    monkeypatch.setattr(_wipe.os, "getuid", lambda: 0)
    monkeypatch.setattr(_wipe.os, "kill", lambda *a: killed.append(a))
    with pytest.raises(PermissionError):
        _wipe.reset_container_dirs()
    assert killed == []
