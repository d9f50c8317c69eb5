"""The built-in server's shutdown, on the offline default model: it honours SIGTERM during a
generation, and it ends when the process that launched it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from areal_agents.net import free_port
from areal_agents.serving.server import BuiltinServer
from tests.serving.test_process import kill_and_reap, wait_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux semantics")

ROOT = Path(__file__).resolve().parents[2]

LAUNCHER = textwrap.dedent(
    """
    import threading, time, httpx
    from areal_agents.serving.server import BuiltinServer

    server = BuiltinServer(max_model_len=2048)
    starter = threading.Thread(target=lambda: server.start().wait_ready(timeout=240))
    starter.start()
    starter.join()  # the thread that launched the server is gone from here on
    print(server.process.pid, server.base_url, flush=True)
    body = {"model": server.served_model_name, "prompt": "Once upon a time",
            "max_tokens": 1500, "ignore_eos": True}
    httpx.post(server.base_url + "/completions", json=body, timeout=600)
    time.sleep(600)
    """
)


def _long_request(server: BuiltinServer, outcome: dict[str, Any]) -> None:
    body = {
        "model": server.served_model_name,
        "prompt": "Once upon a time",
        "max_tokens": 1500,
        "ignore_eos": True,
    }
    try:
        response = httpx.post(f"{server.base_url}/completions", json=body, timeout=600)
        outcome["status"] = response.status_code
        outcome["body"] = response.json() if response.status_code == 200 else response.text
    except httpx.HTTPError as e:
        outcome["error"] = type(e).__name__


@pytest.mark.integration
def test_sigterm_ends_the_server_during_a_generation() -> None:
    server = BuiltinServer(max_model_len=2048)
    server.start()
    try:
        server.wait_ready(timeout=240)
        assert server.process is not None
        outcome: dict[str, Any] = {}
        request = threading.Thread(target=_long_request, args=(server, outcome))
        request.start()
        time.sleep(3.0)
        assert request.is_alive(), f"the 1500-token generation ended already: {outcome}"
        started = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=30)  # was: still generating (and alive) minutes later
        took = time.monotonic() - started
        request.join(timeout=30)
        assert not request.is_alive()
        assert took < 30
        # The request did not run to its end: it failed, or came back aborted.
        if outcome.get("status") == 200:
            choice = outcome["body"]["choices"][0]
            assert choice["finish_reason"] == "abort", choice["finish_reason"]
    finally:
        server.stop()


@pytest.mark.integration
def test_server_dies_with_its_sigkilled_launcher() -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    pid_text, base_url = launcher.stdout.readline().split()
    pid = int(pid_text)
    try:
        time.sleep(2.0)  # the long request is being generated now
        root = base_url.removesuffix("/v1")
        assert httpx.get(f"{root}/health", timeout=10).status_code == 200
        launcher.kill()
        launcher.wait()
        assert wait_gone(pid, 30), "the server outlived the SIGKILLed process that launched it"
    finally:
        kill_and_reap(launcher, pid)


def test_serve_exits_when_its_parent_pid_is_gone() -> None:
    """The server's own watch (--parent-pid), without PR_SET_PDEATHSIG: a shell starts it
    with the shell's pid and is SIGKILLed; the orphaned server must end by itself."""
    script = (
        f"{sys.executable} -m areal_agents.serving.serve --parent-pid $$ --port {free_port()} & "
        "echo $!; wait"
    )
    shell = subprocess.Popen(["sh", "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert shell.stdout is not None
    pid = int(shell.stdout.readline())
    try:
        time.sleep(1.0)
        shell.kill()
        shell.wait()
        assert wait_gone(pid, 30), "serve outlived the process named by --parent-pid"
    finally:
        kill_and_reap(shell, pid)
