"""``eval`` survives grading output that is not Unicode text (issue 28 M1).

The red team's ``e3_eval_surrogate.py`` (round 3), ported: against an endpoint whose (ASCII)
reply is a solution raising ``ValueError('\\ud800 boom')``, the lone surrogate reached the
reward's details, then the transcripts, then the viewer (``index.html``, written with
``ensure_ascii=False``), and ``python -m areal_agents.eval`` exited 1 with a traceback; so did
a reply with a NUL byte in its code block. New replies of the family: surrogates raised at
import, in a ``KeyError``, next to a NUL, from ``bytes.decode(..., 'surrogateescape')``, and
through the python tool. Each run finishes every episode and writes files that are UTF-8.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal_agents.eval import main
from tests.policies.fake_openai import FakeOpenAI

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
EPISODES = 2


def _fenced(code: str) -> str:
    return f"```python\n{code}```"


_ADD = "def add(a, b):\n    "
REPLIES = {  # the answers a scripted model gives: e3's two, then new ones
    "surrogate_in_a_message": _fenced("def add(a, b):\n    raise ValueError('\\ud800 boom')\n"),
    "nul_in_the_code": _fenced("def add(a, b):\n    return a + b\x00\n"),
    "surrogate_at_import": _fenced("raise ValueError('\\udcff at import')\n" + _ADD + "pass\n"),
    "surrogate_key_error": _fenced("def add(a, b):\n    raise KeyError('\\udfff')\n"),
    "surrogate_and_nul": _fenced("def add(a, b):\n    raise ValueError('\\x00\\ud800\\x00')\n"),
    "surrogateescape": _fenced(
        _ADD + "raise ValueError(bytes([255, 254]).decode('utf-8', 'surrogateescape'))\n"
    ),
}  # fmt: skip


class _Agent:
    """Answers with ``reply``; with ``tool_first``, first runs the python tool on code whose
    output and error hold what is not UTF-8."""

    def __init__(self, reply: str, tool_first: bool = False) -> None:
        self.reply, self.tool_first = reply, tool_first

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        if self.tool_first and messages[-1]["role"] == "user":
            code = (
                "import sys\nsys.stdout.buffer.write(bytes([111, 107, 255]))\n"
                "sys.stdout.flush()\nraise ValueError('\\ud800')\n"
            )
            arguments = json.dumps({"code": code})
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "python", "arguments": arguments},
            }
            return {"content": None, "tool_calls": [call]}
        return {"content": self.reply}


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("AREAL_API_KEY", raising=False)
    yield


def _args(base_url: str, out: Path) -> list[str]:
    return [
        "env=code_sandbox",
        "env_kwargs={sandbox_backend: process, templates: [add]}",
        f"policy.base_url={base_url}",
        "policy.model=scripted",
        f"num_episodes={EPISODES}",
        "concurrency=1",
        f"output_dir={out}",
        "progress=false",
    ]


def _all_utf8(out: Path) -> None:
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "transcripts.jsonl", "index.html"} <= names, names
    for path in out.iterdir():
        if path.is_file():
            path.read_bytes().decode("utf-8")  # raises on an unencodable surrogate's bytes
    for line in (out / "transcripts.jsonl").read_text().splitlines():
        json.loads(line)


@pytest.mark.parametrize("reply", list(REPLIES.values()), ids=list(REPLIES))
def test_eval_finishes_and_writes_utf8(key: None, tmp_path: Path, reply: str) -> None:
    with FakeOpenAI(_Agent(reply)).running() as fake:
        summary = main(_args(fake.base_url, tmp_path))
    assert summary["episodes"] == EPISODES and summary["episodes_dropped"] == 0
    assert summary["mean_reward"] == 0.0
    _all_utf8(tmp_path)


def test_a_tool_output_that_is_not_utf8_is_written_too(key: None, tmp_path: Path) -> None:
    agent = _Agent(REPLIES["surrogate_in_a_message"], tool_first=True)
    with FakeOpenAI(agent).running() as fake:
        summary = main(_args(fake.base_url, tmp_path))
    assert summary["episodes"] == EPISODES and summary["tool_calls_per_episode"] == 1.0
    _all_utf8(tmp_path)


def test_the_command_line_exits_zero_without_a_traceback(tmp_path: Path) -> None:
    """e3's own path: the real command, in its own process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "test-key"}
    with FakeOpenAI(_Agent(REPLIES["surrogate_in_a_message"])).running() as fake:
        proc = subprocess.run(
            [sys.executable, "-m", "areal_agents.eval", *_args(fake.base_url, tmp_path)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    _all_utf8(tmp_path)
