"""The docker backend's own promises: limits in force, warm pool, labels, clean-up after SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from areal_agents.errors import SandboxError
from areal_agents.sandboxes import make_sandbox
from areal_agents.sandboxes.docker import DockerSandbox
from areal_agents.sandboxes.docker_pool import LABEL, docker_client, reap_orphans

pytestmark = pytest.mark.docker

LIMITS = {"memory_mb": 128, "pids": 32, "disk_mb": 16, "max_output_bytes": 16 * 1024}


def test_container_runs_with_the_documented_limits():
    with make_sandbox("docker", cpus=0.5, **LIMITS) as sb:
        assert isinstance(sb, DockerSandbox)
        attrs = docker_client().api.inspect_container(sb.container_id)
        assert sb.run("id -u").stdout == "65534\n"
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert sorted(host["CapAdd"]) == ["KILL", "SETGID", "SETUID", "SYS_CHROOT"]  # root's only
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == host["MemorySwap"] == 128 * 2**20
    assert host["PidsLimit"] == 32
    assert host["NanoCpus"] == 5 * 10**8
    labels = attrs["Config"]["Labels"]
    assert labels[LABEL] == "1" and labels[f"{LABEL}.pid"] == str(os.getpid())


def test_warm_pool_hands_out_reset_containers_again():
    limits = {**LIMITS, "open_files": 200}  # limits of its own: a fresh pool for this test
    with make_sandbox("docker", pool_size=1, **limits) as sb:
        first = sb.container_id
        sb.write_file("episode1.txt", "x")
        sb.run("sleep 100 &")
        pool = sb._pool
    deadline = time.monotonic() + 30
    while first not in [c.id for c in pool._ready] and time.monotonic() < deadline:
        time.sleep(0.05)  # the background reset puts it back on the shelf
    ready = [c.id for c in pool._ready]
    assert first in ready
    while ready[0] != first:  # take the others off the shelf first
        pool.release(pool.acquire())
        ready = [c.id for c in pool._ready]
    with make_sandbox("docker", pool_size=1, **limits) as sb:
        assert sb.container_id == first
        assert sb.run("ls -A /work").stdout == ""  # the previous episode's file is gone


_PLANT = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
os.setxattr("/work", "user.note", b"episode 1 was here")
print(libc.mq_open(b"/episode1", 0o100 | 0o2, 0o666, None) >= 0)
os.chmod("/work", 0o777)
os.utime("/work", (1893456000, 1893456000))
"""
_LOOK = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
st = os.stat("/work")
print(os.listxattr("/work"), os.listdir("/dev/mqueue"), oct(st.st_mode & 0o777),
      int(st.st_mtime) == 1893456000, libc.mq_open(b"/episode1", 0o2, 0, None) >= 0)
"""


def test_warm_pool_resets_what_an_episode_leaves_in_the_container():
    limits = {**LIMITS, "open_files": 201}  # limits of its own: a fresh pool for this test
    with make_sandbox("docker", pool_size=1, **limits) as sb:
        first = sb.container_id
        assert sb.run_python(_PLANT, timeout=10).stdout == "True\n"
        pool = sb._pool
    deadline = time.monotonic() + 30
    while first not in [c.id for c in pool._ready] and time.monotonic() < deadline:
        time.sleep(0.05)
    ready = [c.id for c in pool._ready]
    assert first in ready  # reset in place, not replaced
    while ready[0] != first:
        pool.release(pool.acquire())
        ready = [c.id for c in pool._ready]
    with make_sandbox("docker", pool_size=1, **limits) as sb:
        assert sb.container_id == first
        res = sb.run_python(_LOOK, timeout=10)
    assert res.stdout == "[] [] 0o700 False False\n", res


def test_the_supervisor_is_out_of_the_programs_reach():
    code = """
import os
report = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    uid = [l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")][0]
    if uid == "0":
        try:
            os.kill(int(pid), 0); report.append("signalled")
        except PermissionError:
            pass
        try:
            open(f"/proc/{pid}/environ", "rb").read(); report.append("read")
        except PermissionError:
            pass
        report.append("root")
print(sorted(set(report)))
"""
    with make_sandbox("docker", **LIMITS) as sb:
        res = sb.run_python(code, timeout=10)
    assert res.stdout == "['root']\n", res  # root processes exist, none reachable


def _root_sh(cid: str, script: str) -> str:
    out = docker_client().api.exec_create(cid, ["/bin/sh", "-c", script], user="0:0")
    return docker_client().api.exec_start(out["Id"]).decode()


def test_a_run_whose_supervisor_dies_takes_its_container_with_it():
    results = []
    with make_sandbox("docker", **LIMITS) as sb:
        cid = sb.container_id
        runner = threading.Thread(target=lambda: results.append(sb.run("sleep 60", timeout=30)))
        runner.start()
        find = (
            "for d in /proc/[0-9]*; do read -r n < $d/comm;"
            " [ $n = timeout ] && echo ${d#/proc/}; done"
        )
        deadline = time.monotonic() + 20
        while not (pid := _root_sh(cid, find).strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid, "the run did not start"
        # what an OOM kill of the supervising shell would do: end it without a status line
        _root_sh(cid, f"kill -9 $(cut -d' ' -f4 /proc/{pid}/stat)")
        runner.join(60)
        res = results[0]
        assert not docker_client().api.inspect_container(cid)["State"]["Running"]
        again = sb.run("echo fresh", timeout=10)
        assert sb.container_id != cid
    assert "did not end normally" in res.stderr and not res.ok, res
    assert again.stdout == "fresh\n", again


def test_files_round_trip_binary_and_large():
    data = bytes(range(256)) * 4096  # 1 MiB
    with make_sandbox("docker", **LIMITS) as sb:
        sb.write_file("dir/blob.bin", data)
        assert sb.read_file("/work/dir/blob.bin") == data
        assert sb.run("wc -c < dir/blob.bin").stdout.strip() == str(len(data))
        assert sb.run("tr a-z A-Z", stdin="shout").stdout == "SHOUT"


def test_reset_kills_processes_and_empties_the_work_dir():
    with make_sandbox("docker", **LIMITS) as sb:
        sb.write_file("a.txt", "1")
        sb.reset()
        assert sb.run("ls -A /work /tmp").stdout.split() == ["/tmp:", "/work:"]


_RUNC = b"OCI runtime exec failed: exec failed: unable to start container process: x\r\n"


def test_an_exec_the_runtime_failed_to_start_is_tried_again(monkeypatch: pytest.MonkeyPatch):
    # about 1 quick exec in 300 at pids=8: runc's exec init cannot start and the engine reports
    # 126 with runc's message as the whole stream; the program never ran, so it runs again
    with make_sandbox("docker", **LIMITS) as sb:
        real, calls = type(sb._exec)._once, []
        forge = "printf 'OCI runtime exec failed: x\\r\\n'; exit 126"
        ours = ("echo ran", forge)  # the pool's resets of other containers run beside

        def flaky(self, argv, **kw):
            if argv[-1] in ours:
                calls.append(argv[-1])
                if len(calls) == 1:
                    return _RUNC, b"", (len(_RUNC), 0), 126, b""
            return real(self, argv, **kw)

        monkeypatch.setattr(type(sb._exec), "_once", flaky)
        res = sb.run("echo ran", timeout=10)
        assert (res.exit_code, res.stdout, calls) == (0, "ran\n", ["echo ran"] * 2), res
        forged = sb.run(forge, timeout=10)
        assert forged.exit_code == 126 and forged.stdout.startswith("OCI runtime"), forged
        assert calls.count(forge) == 1  # a program that ran and printed it: not run again


def test_a_container_removed_from_outside_is_an_infrastructure_error():
    sb = make_sandbox("docker", **LIMITS)
    docker_client().api.remove_container(sb.container_id, force=True)
    with pytest.raises(SandboxError):
        sb.run("true")
    sb.close()


async def test_concurrent_episodes_share_one_event_loop():
    sandboxes = [make_sandbox("docker", **LIMITS) for _ in range(3)]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    results = await asyncio.gather(
        *(
            sb.arun_python(f"import time; time.sleep(0.5); print({i})")
            for i, sb in enumerate(sandboxes)
        )
    )
    task.cancel()
    for sb in sandboxes:
        await sb.aclose()
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]
    assert ticks >= 10


_CHILD = """
import sys, time
from areal_agents.sandboxes import make_sandbox
sb = make_sandbox("docker", pool_size=1, memory_mb=128)
print(sb.container_id, flush=True)
time.sleep(600)
"""


def _labelled_by(pid: int) -> list[str]:
    client = docker_client()
    found = client.containers.list(all=True, filters={"label": f"{LABEL}.pid={pid}"})
    return [c.id for c in found]


def test_containers_of_a_sigkilled_process_are_reaped_on_next_start():
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        cid = child.stdout.readline().strip()
        assert cid, "child did not start a sandbox"
        time.sleep(1.0)  # its pool refill has started too
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert cid in _labelled_by(child.pid)  # SIGKILL left them behind
    deadline = time.monotonic() + 30
    while _labelled_by(child.pid) and time.monotonic() < deadline:
        reap_orphans()
        time.sleep(0.2)
    assert _labelled_by(child.pid) == []


def test_sigterm_removes_the_process_containers():
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip()
    time.sleep(1.0)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == -signal.SIGTERM
    assert _labelled_by(child.pid) == []
