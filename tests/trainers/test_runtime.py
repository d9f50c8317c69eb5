"""A local run's Ray: its own instance, on loopback, quiet, gone 10 s after ``kill -9``, and
its session directory removed.

Each test runs a real driver (``start_ray`` + one actor) in a child process, with Ray's temp
directory pointing at a fresh folder that holds a stale "current cluster" record — the
state a killed cluster leaves behind, in which ``ray.init(num_cpus=...)`` without an address
fails ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided").
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    import psutil, ray
    from areal_agents.trainers.config import RayConfig
    from areal_agents.trainers.runtime import start_ray, stop_ray

    assert start_ray(RayConfig(num_cpus=1, object_store_mb=80))

    @ray.remote(num_cpus=0)
    class Echo:
        def pid(self):
            return os.getpid()

    first = Echo.options(name="first").remote()
    actor_pid = ray.get(first.pid.remote())
    me = psutil.Process()
    tree = {p.pid: [p.name(), p.create_time()] for p in me.children(recursive=True)}
    listening = sorted(
        {(p.name(), c.laddr.ip) for p in me.children(recursive=True)
         for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    )
    gcs = ray.get_runtime_context().gcs_address
    print(json.dumps({"tree": tree, "listening": listening, "actor": actor_pid, "gcs": gcs}),
          flush=True)
    if sys.argv[1] == "stop":
        sessions = len([p for p in os.listdir(os.environ["RAY_TMPDIR"] + "/ray")
                        if p.startswith("session_2")])
        stop_ray()
        left = [p.pid for p in me.children(recursive=True) if p.status() != "zombie"]
        print(json.dumps({"left": left, "sessions": sessions}), flush=True)
    elif sys.argv[1] == "signal":  # the test signals this process group, then this asks
        import signal
        got = []
        signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
        print(json.dumps({"ready": True}), flush=True)
        while not got:
            time.sleep(0.05)
        time.sleep(3)  # time for a daemon that took the signal to go, and its workers with it
        again = ray.get(Echo.remote().pid.remote(), timeout=60)
        print(json.dumps({"after_signal": again, "same": ray.get(
            ray.get_actor("first").pid.remote(), timeout=60) == actor_pid}), flush=True)
        stop_ray()
    else:
        time.sleep(600)
    """
)


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A short temp dir (Ray's socket paths must stay under 108 bytes) with a stale record."""
    tmp = Path(tempfile.mkdtemp(prefix="ray"))
    (tmp / "ray").mkdir()
    (tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # nothing listens there
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _driver(mode: str, ray_tmp: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_TMPDIR": str(ray_tmp)}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the one a terminal or supervisor signals
    )


def _first_report(driver: subprocess.Popen[str]) -> dict[str, Any]:
    assert driver.stdout is not None
    line = driver.stdout.readline()
    if not line:
        driver.wait(timeout=60)
        pytest.fail(
            f"the driver did not start Ray: {driver.stderr.read() if driver.stderr else ''}"
        )
    return dict(json.loads(line))


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _alive(tree: dict[str, list[Any]]) -> list[str]:
    out = []
    for pid, (name, created) in tree.items():
        try:
            p = psutil.Process(int(pid))
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} {name}")
        except psutil.NoSuchProcess:
            pass
    return out


def test_kill_9_of_the_driver_leaves_no_ray_process_10_s_later(ray_tmp: Path) -> None:
    driver = _driver("kill", ray_tmp)
    try:
        report = _first_report(driver)
    except BaseException:
        driver.kill()
        raise
    tree = report["tree"]
    names = {name for name, _ in tree.values()}
    assert {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names
    # On loopback only (Ray would otherwise register and listen on the network address).
    assert report["listening"]
    assert [x for x in report["listening"] if not _loopback(x[1])] == []
    driver.kill()  # kill -9
    driver.wait()
    deadline = time.monotonic() + 10
    while alive := _alive(tree):
        if time.monotonic() > deadline:
            for entry in alive:  # leave nothing behind for the next test
                os.kill(int(entry.split()[0]), 9)
            pytest.fail(f"alive 10 s after kill -9 of the driver: {alive}")
        time.sleep(0.2)
    assert driver.stderr is not None
    err = driver.stderr.read()
    assert "Token authentication" not in err  # no warning printed
    assert "existing cluster" not in err
    while sessions := _sessions(ray_tmp):  # the reaper removes it once the processes are gone
        if time.monotonic() > deadline + 10:
            pytest.fail(f"session directory left after kill -9 of the driver: {sessions}")
        time.sleep(0.2)


def _sessions(ray_tmp: Path) -> list[str]:
    return sorted(p.name for p in (ray_tmp / "ray").iterdir() if p.name.startswith("session"))


def test_stop_ray_leaves_no_process_behind(ray_tmp: Path) -> None:
    driver = _driver("stop", ray_tmp)
    out, err = driver.communicate(timeout=180)
    assert driver.returncode == 0, err
    first, last = (json.loads(line) for line in out.splitlines()[:2])
    assert last["left"] == []
    assert last["sessions"] == 1  # the run did have a session directory
    assert _alive(first["tree"]) == []
    assert _sessions(ray_tmp) == []  # ... and stop_ray removed it (and session_latest)
    assert "Token authentication" not in err


def test_sigterm_to_the_drivers_process_group_spares_ray_and_its_actors(ray_tmp: Path) -> None:
    """``kill -TERM -PGID`` (a supervisor, ``timeout``, a graceful stop of the trainer) is the
    driver's to handle: no Ray daemon shares its process group, so the actors live on and the
    driver can still finish its step and save it."""
    driver = _driver("signal", ray_tmp)
    try:
        report = _first_report(driver)
        assert driver.stdout is not None and json.loads(driver.stdout.readline())["ready"]
        groups = {pid: os.getpgid(int(pid)) for pid in report["tree"] if _alive_pid(int(pid))}
        assert driver.pid not in groups.values(), (report["tree"], groups)
        os.killpg(driver.pid, signal.SIGTERM)
        out, err = driver.communicate(timeout=120)
    except BaseException:
        os.killpg(driver.pid, signal.SIGKILL)
        raise
    assert driver.returncode == 0, err[-3000:]
    after = json.loads(out.splitlines()[-1])
    assert after["same"] and after["after_signal"] > 0  # the old actor answers, a new one starts


def _alive_pid(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_live_ray_start_is_not_attached_to(ray_tmp: Path) -> None:
    """``ray start`` left running (its record names a live cluster): a local run still starts
    its own instance instead of attaching to it (or failing on num_cpus)."""
    from areal_agents.net import free_port
    from areal_agents.trainers.ray_reaper import sweep

    port = free_port()
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    ray_bin = Path(sys.executable).with_name("ray")
    started = subprocess.run(
        [str(ray_bin), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats",
         f"--object-store-memory={80 * 2**20}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    head_session = (ray_tmp / "ray" / "session_latest").resolve()
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        record = (ray_tmp / "ray" / "ray_current_cluster").read_text()
        assert record.strip().endswith(f":{port}")  # the record names the live cluster
        driver = _driver("stop", ray_tmp)
        out, err = driver.communicate(timeout=180)
        assert driver.returncode == 0, err
        first = json.loads(out.splitlines()[0])
        assert not first["gcs"].endswith(f":{port}")  # its own instance
        assert "existing cluster" not in err
        assert head_session.is_dir()  # the run's clean-up left the other cluster's session
    finally:  # end the processes `ray start` began (by pid: those holding its session open)
        for _ in range(5):
            if not sweep("no-token", str(head_session), {os.getpid()}):
                break
            time.sleep(0.5)
