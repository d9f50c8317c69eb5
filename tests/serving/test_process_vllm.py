"""A vLLM server (and the engine processes it forks) ends with the process that launched it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import vllm_python

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux semantics"),
]

ROOT = Path(__file__).resolve().parents[2]

LAUNCHER = textwrap.dedent(
    """
    import sys, threading, time
    from areal_agents.serving.vllm import VLLMServer

    server = VLLMServer(python=sys.argv[1], max_model_len=1024, dtype="float32")
    starter = threading.Thread(target=lambda: server.start().wait_ready(timeout=600))
    starter.start()
    starter.join()
    print(server.process.pid, flush=True)
    time.sleep(900)
    """
)


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def test_vllm_and_its_engine_processes_die_with_the_sigkilled_launcher() -> None:
    python = vllm_python()
    if python is None:  # conftest has skipped (or failed) the test already
        pytest.skip("no vLLM environment")
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(python)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    line = launcher.stdout.readline()
    assert line, "the launcher exited before vLLM was ready"
    pid = int(line)
    try:
        assert len(_group(pid)) >= 2, "expected vLLM's API server and its engine process"
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 60
        while _group(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _group(pid) == [], "vLLM processes outlived the SIGKILLed launcher"
    finally:
        launcher.kill()
        launcher.wait()
        for member in _group(pid):
            os.kill(member, signal.SIGKILL)
