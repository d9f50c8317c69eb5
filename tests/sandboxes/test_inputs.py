"""The input rules every backend shares: paths of file operations, text handed to processes."""

from __future__ import annotations

import pytest

from areal_agents.errors import ToolError
from areal_agents.sandboxes._inputs import command_refusal, encode_data, work_relpath


@pytest.mark.parametrize(
    ("path", "rel"),
    [
        ("a.txt", "a.txt"),
        ("/work/a.txt", "a.txt"),
        ("/work//x/./y/../z", "x/z"),
        ("sub/", "sub"),
        ("-rf", "-rf"),
        ("a\nb", "a\nb"),
    ],
)
def test_paths_inside_the_work_dir_are_normalised(path: str, rel: str):
    assert work_relpath(path, "/work") == rel


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("..", "leads outside"),
        ("a/../../x", "leads outside"),
        ("/work/../etc/passwd", "leads outside"),
        ("/etc/passwd", "outside the work directory /work"),
        ("//etc/passwd", "outside the work directory /work"),
        ("/workshop/x", "outside the work directory /work"),
        ("", "names the work directory itself"),
        ("/work/", "names the work directory itself"),
        ("x" * 256, "longer than the limit of 255"),
        ("d/" * 2048 + "f", "longer than the limit of 4095"),
        ("a\x00b", "NUL byte"),
        ("a\ud800", "not valid UTF-8"),
    ],
)
def test_paths_that_cannot_name_a_file_in_the_work_dir_are_refused(path: str, words: str):
    with pytest.raises(ToolError, match=words):
        work_relpath(path, "/work")


def test_a_path_that_is_not_text_is_refused():
    with pytest.raises(ToolError, match="must be text"):
        work_relpath(b"a.txt", "/work")  # type: ignore[arg-type]


def test_data_is_encoded_or_refused():
    assert encode_data("é") == "é".encode()
    assert encode_data(b"\xff") == b"\xff"
    with pytest.raises(ToolError, match="not valid UTF-8"):
        encode_data("\udc80")
    with pytest.raises(ToolError, match="text or bytes"):
        encode_data(3)  # type: ignore[arg-type]


def test_commands_that_can_run_are_not_refused():
    assert command_refusal("echo hi", stdin="a\x00b") is None  # NUL is fine in stdin
    assert command_refusal(["echo", "é"]) is None
    assert command_refusal(code="print(1)") is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"cmd": "echo a\x00b"}, "the command contains a NUL byte"),
        ({"cmd": ["echo", "a\x00b"]}, "argument 1 of the command contains a NUL byte"),
        ({"code": "print(1)\x00"}, "the program contains a NUL byte"),
        ({"code": "'\ud800'"}, "the program is not valid UTF-8"),
        ({"cmd": "cat", "stdin": "\udfff"}, "stdin is not valid UTF-8"),
        ({"cmd": ["echo", "x" * 131_072]}, "longer than one argument may be"),
        ({"cmd": ["echo", *["x" * 100_000] * 21]}, "longer in all than the kernel allows"),
        ({"cmd": ["echo", 3]}, "is a int, not text"),
    ],
)
def test_text_no_process_can_receive_is_a_126_result(kwargs: dict, words: str):
    res = command_refusal(**kwargs)
    assert res is not None and res.exit_code == 126 and words in res.stderr, res
    assert res.stdout == "" and not res.timed_out
