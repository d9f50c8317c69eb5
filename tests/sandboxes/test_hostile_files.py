"""Hostile files against ``read_file``/``write_file``, one property each, on every backend.

A program plants FIFOs, sockets, symlinks out of the work directory or to devices, over-long
names; the host's file operations must refuse them at once with a ``ToolError`` whose message
is the same on every backend, never block, never follow a link out, never raise a raw
``OSError``/``ValueError``/``UnicodeEncodeError``. ``pytest.mark.timeout`` turns a regression
(a blocked open) into a failure instead of a hang.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_agents.errors import ToolError
from tests.sandboxes._hostile import Make

pytestmark = pytest.mark.timeout(120)


def _refused(fn, match: str) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ToolError, match=match) as info:
        fn()
    return str(info.value)


def test_reading_a_fifo_is_refused_without_blocking(any_sandbox: Make):
    with any_sandbox() as sb:
        assert sb.run("mkfifo fifo", timeout=5).ok
        msg = _refused(lambda: sb.read_file("fifo"), "not a regular file")
        assert sb.run("echo alive", timeout=5).stdout == "alive\n"
    assert msg == "path 'fifo' is not a regular file (a directory, FIFO, socket or device)"


def test_writing_a_fifo_is_refused_without_blocking(any_sandbox: Make):
    with any_sandbox() as sb:
        assert sb.run("mkfifo fifo", timeout=5).ok
        _refused(lambda: sb.write_file("fifo", "x"), "not a regular file")
        assert sb.run("test -p fifo && echo still-a-fifo", timeout=5).stdout == "still-a-fifo\n"


def test_a_socket_and_a_directory_are_not_regular_files(any_sandbox: Make):
    with any_sandbox() as sb:
        res = sb.run_python(
            "import os, socket\nos.mkdir('d')\nsocket.socket(socket.AF_UNIX).bind('sock')",
            timeout=5,
        )
        assert res.ok, res
        for path in ("sock", "d"):
            _refused(lambda path=path: sb.read_file(path), "not a regular file")
            _refused(lambda path=path: sb.write_file(path, "x"), "not a regular file")


def test_a_symlink_to_a_device_is_refused(any_sandbox: Make):
    with any_sandbox() as sb:
        sb.run("ln -s /dev/zero zero; ln -s /dev/urandom rnd", timeout=5)
        for path in ("zero", "rnd"):
            msg = _refused(lambda path=path: sb.read_file(path), "leads outside")
            assert msg == f"path {path!r} leads outside the work directory"


def test_a_symlink_out_of_the_work_dir_is_not_followed_for_reading(any_sandbox: Make):
    with any_sandbox() as sb:
        sb.run("ln -s /etc/passwd lnpasswd; ln -s / lnroot; ln -s ../../../../etc lnup", timeout=5)
        for path in ("lnpasswd", "lnroot/etc/hostname", "lnup/passwd"):
            _refused(lambda path=path: sb.read_file(path), "leads outside")


def test_a_symlink_out_of_the_work_dir_is_not_followed_for_writing(
    any_sandbox: Make, tmp_path: Path
):
    target = tmp_path / "planted"
    tmp_path.chmod(0o777)
    with any_sandbox() as sb:
        sb.run(f"ln -s {target} lnout; ln -s / lnroot", timeout=5)
        _refused(lambda: sb.write_file("lnout", "x"), "leads outside")
        _refused(lambda: sb.write_file("lnroot/tmp/planted", "x"), "leads outside")
        inside = sb.run("ls /tmp/planted 2>/dev/null; echo done", timeout=5)
    assert not target.exists()
    assert inside.stdout == "done\n", inside


def test_a_symlink_inside_the_work_dir_is_followed(any_sandbox: Make):
    with any_sandbox() as sb:
        sb.write_file("data.txt", "one")
        sb.run("mkdir sub && ln -s ../data.txt sub/alias", timeout=5)
        assert sb.read_file("sub/alias") == b"one"
        sb.write_file("sub/alias", "two")
        assert sb.read_file("data.txt") == b"two"


def test_a_name_longer_than_the_kernel_allows_is_a_tool_error(any_sandbox: Make):
    with any_sandbox() as sb:
        _refused(lambda: sb.write_file("x" * 300, "x"), "longer than the limit of 255")
        _refused(lambda: sb.read_file("x" * 300), "longer than the limit of 255")
        _refused(lambda: sb.write_file("d/" * 2100 + "f", "x"), "longer than the limit of 4095")


def test_a_nul_byte_in_a_path_is_a_tool_error(any_sandbox: Make):
    with any_sandbox() as sb:
        _refused(lambda: sb.write_file("nul\x00byte", "x"), "NUL byte")
        _refused(lambda: sb.read_file("nul\x00byte"), "NUL byte")


def test_text_without_a_utf8_form_is_a_tool_error(any_sandbox: Make):
    with any_sandbox() as sb:
        _refused(lambda: sb.write_file("bad\ud800.txt", "x"), "not valid UTF-8")
        _refused(lambda: sb.write_file("ok.txt", "content \udfff"), "not valid UTF-8")
        sb.write_file("ok.txt", b"\xed\xa0\x80 bytes are written as they are")
        assert sb.read_file("ok.txt").startswith(b"\xed\xa0\x80")


def test_a_file_larger_than_the_disk_limit_is_a_tool_error(any_sandbox: Make):
    with any_sandbox(disk_mb=16) as sb:
        _refused(lambda: sb.write_file("big.bin", b"\0" * (20 << 20)), "exceeds the sandbox's 16")
        assert sb.run("ls -A", timeout=5).stdout == ""


def test_a_write_past_the_free_space_is_a_tool_error(any_sandbox: Make):
    with any_sandbox(disk_mb=16) as sb:
        sb.write_file("a.bin", b"\1" * (10 << 20))
        _refused(lambda: sb.write_file("b.bin", b"\2" * (10 << 20)), "no space left")
        _refused(lambda: sb.read_file("b.bin"), "no such file")  # nothing half-written stays
        assert len(sb.read_file("a.bin")) == 10 << 20


def test_a_parent_that_is_a_file_is_a_tool_error(any_sandbox: Make):
    with any_sandbox() as sb:
        sb.write_file("a.txt", "x")
        msg = _refused(lambda: sb.write_file("a.txt/b/c.txt", "y"), "not a directory")
        _refused(lambda: sb.read_file("a.txt/b"), "no such file")
    assert msg == "path 'a.txt/b/c.txt' runs through something that is not a directory"


def test_every_backend_refuses_with_the_same_words(any_sandbox: Make):
    expected = {
        "..": "path '..' leads outside the work directory",
        "a/../../x": "path 'a/../../x' leads outside the work directory",
        ".": "path '.' names the work directory itself",
        "": "path '' names the work directory itself",
        "missing.txt": "no such file in the sandbox: 'missing.txt'",
        "lnpasswd": "path 'lnpasswd' leads outside the work directory",
        "fifo": "path 'fifo' is not a regular file (a directory, FIFO, socket or device)",
    }
    seen = {}
    with any_sandbox() as sb:
        sb.run("mkfifo fifo; ln -s /etc/passwd lnpasswd", timeout=5)
        for path in expected:
            try:
                sb.read_file(path)
            except ToolError as e:
                seen[path] = str(e)
    assert seen == expected


def test_an_absolute_symlink_into_the_work_dir_is_followed(any_sandbox: Make):
    with any_sandbox() as sb:
        sb.write_file("data.txt", "one")
        sb.run('ln -s "$PWD/data.txt" alias && ln -s "$PWD/../etc/passwd" sneaky', timeout=5)
        assert sb.read_file("alias") == b"one"
        _refused(lambda: sb.read_file("sneaky"), "leads outside")
