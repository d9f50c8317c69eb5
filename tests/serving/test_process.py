"""ServerProcess's lifecycle on real child processes (no model): parent death, stop, terminate.

The "server" here is a plain Python child that sleeps (or ignores SIGTERM), so these tests
check the launcher's process handling itself, fast; tests/serving/test_serve.py does the same
with the built-in server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from areal_agents.errors import EndpointError
from areal_agents.serving.process import ServerProcess, parent_death_hook

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux semantics")

ROOT = Path(__file__).resolve().parents[2]

SLEEPER = textwrap.dedent(
    """
    import sys, threading, time
    from areal_agents.serving.process import ServerProcess

    class Sleeper(ServerProcess):
        def __init__(self, die_with_parent):
            self.root_url = "http://127.0.0.1:9"
            self.log_path = None
            self.process = None
            self._log = None
            self.die_with_parent = die_with_parent

        def command(self):
            return [sys.executable, "-c", "import time; time.sleep(300)"]

    server = Sleeper(die_with_parent=sys.argv[1] == "1")
    # Started from a thread that ends at once: the child must outlive that thread.
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
    print(server.process.pid, flush=True)
    time.sleep(300)
    """
)


def is_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        time.sleep(0.1)
    return is_gone(pid)


def kill_and_reap(process: subprocess.Popen[Any], *pids: int | None) -> None:
    """Clean-up after a test: SIGKILL ``process`` and wait for it, then SIGKILL each of
    ``pids`` (processes it started) that is still alive."""
    process.kill()
    process.wait()
    for pid in pids:
        if pid is not None and not is_gone(pid):
            os.kill(pid, signal.SIGKILL)


class Child(ServerProcess):
    """A ServerProcess running ``code`` in a Python child."""

    def __init__(self, code: str, die_with_parent: bool = True) -> None:
        self.code = code
        self.root_url = "http://127.0.0.1:9"
        self.log_path = None
        self.process = None
        self._log = None
        self.die_with_parent = die_with_parent

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]


def _launch_parent(die_with_parent: bool) -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, "1" if die_with_parent else "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def test_child_dies_when_the_parent_is_killed() -> None:
    parent, child = _launch_parent(die_with_parent=True)
    try:
        time.sleep(1.5)  # the thread that called start() has ended by now
        assert not is_gone(child), "the child died with the thread that started it"
        parent.kill()
        parent.wait()
        assert wait_gone(child, 30), "the child outlived its SIGKILLed parent"
    finally:
        kill_and_reap(parent, child)


def test_without_die_with_parent_the_child_survives() -> None:
    """The control: the test above would notice if the mechanism did nothing."""
    parent, child = _launch_parent(die_with_parent=False)
    try:
        parent.kill()
        parent.wait()
        time.sleep(1.5)
        assert not is_gone(child)
    finally:
        kill_and_reap(parent, child)


def test_stop_kills_a_child_that_ignores_sigterm() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(300)"
    )
    server = Child(code).start()
    assert server.process is not None and server.log_path is not None
    pid = server.process.pid
    deadline = time.monotonic() + 30
    while b"ready" not in server.log_path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    server.stop(timeout=1.0)
    assert time.monotonic() - started < 10
    assert is_gone(pid)
    assert server.process is None


def test_terminate_returns_at_once_and_the_child_ends() -> None:
    server = Child("import time; time.sleep(300)").start()
    assert server.process is not None
    pid = server.process.pid
    server.terminate()
    assert wait_gone(pid, 10)
    assert server.process.wait(timeout=5) == -signal.SIGTERM
    server.stop()


def test_context_exit_stops_the_child_and_the_launcher_thread() -> None:
    # Thread objects, not idents: a thread that ends meanwhile frees its ident for the launcher.
    before = set(threading.enumerate())
    with Child("import time; time.sleep(300)") as server:
        assert server.process is not None
        pid = server.process.pid
        new = [t for t in threading.enumerate() if t not in before]
        launchers = [t for t in new if t.name == "areal-server-launcher"]
        assert len(launchers) == 1, [t.name for t in new]
    assert is_gone(pid)
    launchers[0].join(timeout=5)
    assert not launchers[0].is_alive()


def test_parent_death_hook_is_linux_prctl() -> None:
    hook = parent_death_hook(signal.SIGTERM)
    assert hook is not None
    # Run it in a real child and read the setting back from the kernel.
    check = (
        "import ctypes, signal; v = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)"  # 2: GET
    )
    out = subprocess.run(
        [sys.executable, "-c", check], preexec_fn=hook, capture_output=True, text=True, timeout=30
    )
    assert int(out.stdout) == signal.SIGTERM


def test_cpus_place_the_server_and_what_it_starts() -> None:
    from areal_agents.serving.vllm import VLLMServer
    from areal_agents.trainers.modeling import tiny_model_path

    before = set(os.sched_getaffinity(0))
    core = max(before)
    code = (
        "import os, subprocess, sys, time;"
        "sub = subprocess.run([sys.executable, '-c', 'import os; print(sorted("
        "os.sched_getaffinity(0)))'], capture_output=True, text=True).stdout.strip();"
        "print(sorted(os.sched_getaffinity(0)), sub, flush=True); time.sleep(60)"
    )
    server = Child(code)
    server.cpus = (core,)
    server.start()
    try:
        assert server.process is not None and server.log_path is not None
        deadline = time.monotonic() + 30
        while not server.log_path.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.log_path.read_text().split() == [f"[{core}]", f"[{core}]"]
    finally:
        server.stop()
    assert set(os.sched_getaffinity(0)) == before  # the launcher stays where it was
    vllm = VLLMServer(str(tiny_model_path()), served_model_name="policy")
    unset = vllm.environment().get("VLLM_CPU_OMP_THREADS_BIND")
    assert unset == os.environ.get("VLLM_CPU_OMP_THREADS_BIND")  # no cpus: left as it is
    vllm.cpus = (0, 1)
    assert vllm.environment()["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"  # its OpenMP threads too


HTTP_CHILD = textwrap.dedent(
    """
    import http.server, sys

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
    """
)


class PortChild(ServerProcess):
    """A ServerProcess serving ``/health`` on its port, as a real server binds it."""

    def __init__(self, port: int, *, chosen: bool) -> None:
        self.host = "127.0.0.1"
        self.log_path = None
        self.process = None
        self._log = None
        self.use_port(port)
        self.port_chosen = chosen

    def command(self) -> list[str]:
        return [sys.executable, "-c", HTTP_CHILD, str(self.port)]


@pytest.fixture
def taken_port() -> Any:
    """A loopback port another socket listens on for the whole test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_chosen_port_found_taken_is_replaced_by_a_free_one(taken_port: int) -> None:
    server = PortChild(taken_port, chosen=True)
    try:
        server.start().wait_ready(timeout=60)
        assert server.port != taken_port
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        assert server.is_healthy()
        assert server.log_path is not None
        log = server.log_path.read_text()
        assert "address already in use" in log.lower()
        assert f"port {taken_port} was taken; starting again on {server.port}" in log
    finally:
        server.stop()


def test_a_port_the_caller_named_is_never_replaced(taken_port: int) -> None:
    server = PortChild(taken_port, chosen=False)
    with pytest.raises(EndpointError, match=r"(?i)address already in use"):
        server.start().wait_ready(timeout=60)
    assert server.port == taken_port
    server.stop()


def test_a_port_taken_every_time_fails_after_the_retries(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks: list[str] = []

    def always_taken(host: str = "127.0.0.1") -> int:
        picks.append(host)
        return taken_port

    monkeypatch.setattr("areal_agents.serving.process.free_port", always_taken)
    server = PortChild(taken_port, chosen=True)
    with pytest.raises(EndpointError, match=r"(?i)address already in use"):
        server.start().wait_ready(timeout=60)
    assert len(picks) == PortChild.port_retries
    server.stop()


def test_the_servers_replace_only_a_port_they_chose() -> None:
    from areal_agents.serving.server import BuiltinServer
    from areal_agents.serving.vllm import VLLMServer

    for kind in (BuiltinServer, VLLMServer):
        assert kind(port=0).port_chosen
        named = kind(port=8123)
        assert not named.port_chosen
        assert named.base_url == "http://127.0.0.1:8123/v1"
