"""``python -m areal_agents.eval`` without ``policy.base_url`` starts the built-in server; a
SIGTERM to eval (or a Ctrl-C) must stop that server before eval exits."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.serving.test_process import is_gone, kill_and_reap

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

ROOT = Path(__file__).resolve().parent.parent


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _server_of(pid: int) -> int | None:
    for child in _children(pid):
        try:
            cmdline = (Path("/proc") / str(child) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"areal_agents.serving.serve" in cmdline:
            return child
    return None


def test_sigterm_to_eval_stops_its_builtin_server(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    command = [
        sys.executable,
        "-m",
        "areal_agents.eval",
        "env=calculator",
        "num_episodes=64",
        "concurrency=4",
        "policy.max_tokens=256",
        "progress=false",
        f"output_dir={out}",
    ]
    log = (tmp_path / "eval.log").open("w")
    evaluation = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server: int | None = None
    try:
        deadline = time.monotonic() + 240
        # config.yaml is written once the server has answered /health and episodes start.
        while not (out / "config.yaml").exists():
            assert evaluation.poll() is None, (tmp_path / "eval.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "eval did not start its episodes in time"
            server = server or _server_of(evaluation.pid)
            time.sleep(0.2)
        server = server or _server_of(evaluation.pid)
        assert server is not None, "no built-in server among eval's children"
        time.sleep(2.0)  # episodes are being generated now
        assert not (out / "summary.json").exists()
        evaluation.send_signal(signal.SIGTERM)
        assert evaluation.wait(timeout=60) == 128 + signal.SIGTERM
        # Gone already when eval has exited: eval stopped it (not only the parent-death signal).
        assert is_gone(server), "eval exited and left its server running"
    finally:
        kill_and_reap(evaluation, server)
        log.close()
