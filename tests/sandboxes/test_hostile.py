"""Hostile programs, one property each, against every isolating backend (docker, bubblewrap).

Each test runs a program that attacks one property, asserts the property held, and then checks
that the host still answers and that a fresh sandbox works. Network isolation is shown only by
failing to reach listeners this test opens on the host's loopback.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_agents.sandboxes import BaseSandbox, bubblewrap, make_sandbox
from tests.sandboxes._hostile import Make, host_and_next_sandbox_ok, run


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.3)
    yield srv
    srv.close()


@pytest.fixture
def udp_listener() -> Iterator[socket.socket]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(0.3)
    yield srv
    srv.close()


# --- network --------------------------------------------------------------------------------


def test_tcp_to_host_loopback_listener_fails(new_sandbox: Make, tcp_listener: socket.socket):
    port = tcp_listener.getsockname()[1]
    res = run(
        new_sandbox,
        f"""
import socket
s = socket.socket()
s.settimeout(1)
try:
    s.connect(("127.0.0.1", {port})); print("connected")
except OSError as e:
    print("blocked", type(e).__name__)
""",
    )
    assert res.stdout.startswith("blocked"), res
    with pytest.raises(TimeoutError):
        tcp_listener.accept()  # nothing arrived on the host side either
    host_and_next_sandbox_ok(new_sandbox)


def test_udp_to_host_loopback_listener_is_lost(new_sandbox: Make, udp_listener: socket.socket):
    port = udp_listener.getsockname()[1]
    res = run(
        new_sandbox,
        f"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    for _ in range(5): s.sendto(b"leak", ("127.0.0.1", {port}))
    print("sent")
except OSError as e:
    print("blocked", type(e).__name__)
""",
    )
    assert res.exit_code == 0, res
    with pytest.raises(TimeoutError):
        udp_listener.recvfrom(16)
    host_and_next_sandbox_ok(new_sandbox)


def test_only_loopback_interface_exists(new_sandbox: Make):
    res = run(new_sandbox, "import socket; print(sorted(n for _, n in socket.if_nameindex()))")
    assert res.stdout.strip() == "['lo']", res
    host_and_next_sandbox_ok(new_sandbox)


def test_docker_socket_unreachable(new_sandbox: Make):
    res = run(
        new_sandbox,
        """
import os, socket
for p in ("/var/run/docker.sock", "/run/docker.sock"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p); print("reached", p)
    except OSError:
        pass
print("done")
""",
    )
    assert res.stdout == "done\n", res
    host_and_next_sandbox_ok(new_sandbox)


# --- processes ------------------------------------------------------------------------------


def test_fork_bomb_is_contained(new_sandbox: Make):
    res = run(new_sandbox, "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass")
    assert res.timed_out or res.exit_code != 0, res
    host_and_next_sandbox_ok(new_sandbox)


def test_shell_fork_bomb_is_contained(new_sandbox: Make):
    with new_sandbox() as sb:
        res = sb.run("b() { b | b & }; b; sleep 1", timeout=2)
    assert res.duration_s < 30, res
    host_and_next_sandbox_ok(new_sandbox)


def _runs_back_to_back(sb: BaseSandbox, calls: int) -> None:
    """``calls`` quick calls all succeed, and a program's own end still comes back as it was: an
    exit code, or a signal."""
    codes = [sb.run("true", timeout=10).exit_code for _ in range(calls)]
    assert codes == [0] * len(codes), [sb.run("true", timeout=10).stderr]
    assert sb.run("exit 3", timeout=10).exit_code == 3
    assert sb.run("kill -9 $$", timeout=10).exit_code == 128 + 9


def test_the_process_limit_counts_processes_alive_not_calls_made(new_sandbox: Make):
    # bwrap exits before its namespace's init is reaped: unless the backend reaps it, each call
    # leaves a zombie counted against the uid's process limit until the host's init gets to it.
    with new_sandbox(pids=16) as sb:
        _runs_back_to_back(sb, 4 * 16)


@pytest.mark.bubblewrap
def test_bubblewraps_python_reaper_keeps_the_process_limit_too(monkeypatch: pytest.MonkeyPatch):
    # where util-linux's unshare cannot give bwrap a PID namespace, REAPER does the reaping
    monkeypatch.setattr(bubblewrap, "unshare_prefix", lambda uid: None)
    with make_sandbox("bubblewrap", memory_mb=128, pids=16) as sb:
        assert sb._wrap(["true"])[4] == bubblewrap.REAPER
        _runs_back_to_back(sb, 4 * 16)
        slow = sb.run("sleep 30", timeout=1)
        assert slow.timed_out and slow.duration_s < 10, slow


def test_thread_bomb_hits_the_task_limit(new_sandbox: Make):
    res = run(
        new_sandbox,
        """
import threading, time
n = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); n += 1
except RuntimeError:
    print("capped at", n)
""",
    )
    assert res.stdout.startswith("capped at"), res
    assert int(res.stdout.split()[-1]) < 64
    host_and_next_sandbox_ok(new_sandbox)


def test_orphaned_background_process_does_not_survive_the_call(new_sandbox: Make):
    with new_sandbox() as sb:
        first = sb.run("sleep 1000 & echo started", timeout=2)
        assert first.stdout == "started\n" and first.duration_s < 2, first
        check = sb.run_python(
            "import glob\n"
            "cmds = [open(p, 'rb').read() for p in glob.glob('/proc/[0-9]*/cmdline')]\n"
            "print(sum(b'sleep\\x001000' in c for c in cmds))",
            timeout=5,
        )
    assert check.stdout == "0\n", check
    host_and_next_sandbox_ok(new_sandbox)


def test_setsid_daemon_does_not_survive_the_call(new_sandbox: Make):
    with new_sandbox() as sb:
        sb.run_python(
            "import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        open('/work/alive', 'w').close()\n"
            "        while True: time.sleep(0.05); open('/work/alive', 'a').write('x')\n"
            "    os._exit(0)\n"
            "deadline = time.time() + 3\n"  # wait for the daemon, however busy the machine
            "while not os.path.exists('/work/alive') and time.time() < deadline:\n"
            "    time.sleep(0.02)\n"
            "time.sleep(0.2)\n",
            timeout=5,
        )
        size_then = len(sb.read_file("alive"))
        check = sb.run("sleep 0.4; wc -c < /work/alive", timeout=5)
    assert int(check.stdout) == size_then, "the daemon kept writing after its call ended"
    host_and_next_sandbox_ok(new_sandbox)


def test_infinite_loop_is_killed_on_time(new_sandbox: Make):
    res = run(new_sandbox, "while True: pass", timeout=1)
    assert res.timed_out and not res.ok, res
    assert res.duration_s < 10, res
    host_and_next_sandbox_ok(new_sandbox)


def test_sleep_past_the_limit_times_out(new_sandbox: Make):
    res = run(new_sandbox, "import time; time.sleep(60); print('woke')", timeout=1)
    assert res.timed_out and "woke" not in res.stdout, res
    host_and_next_sandbox_ok(new_sandbox)


def test_sigterm_ignoring_program_still_dies(new_sandbox: Make):
    res = run(
        new_sandbox,
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)",
        timeout=1,
    )
    assert res.timed_out, res
    host_and_next_sandbox_ok(new_sandbox)


def test_busy_child_is_killed_with_its_parent(new_sandbox: Make):
    with new_sandbox() as sb:
        res = sb.run_python(
            "import subprocess\nsubprocess.run(['python3', '-c', 'while True: pass'])", timeout=1
        )
        assert res.timed_out, res
        check = sb.run_python(
            "import glob\nprint(sum(b'\\x00while True' in open(p, 'rb').read() "
            "for p in glob.glob('/proc/[0-9]*/cmdline')))",
            timeout=5,
        )
    assert check.stdout == "0\n", check
    host_and_next_sandbox_ok(new_sandbox)


def test_signals_to_everything_leave_the_sandbox_usable(new_sandbox: Make):
    with new_sandbox() as sb:
        sb.run_python(
            "import os, signal\n"
            "for pid in (1, -1):\n"
            "    try: os.kill(pid, signal.SIGKILL)\n"
            "    except OSError: pass\n",
            timeout=2,
        )
        again = sb.run_python("print('still here')", timeout=10)
    assert again.stdout == "still here\n", again
    host_and_next_sandbox_ok(new_sandbox)


def test_host_processes_are_invisible_and_unsignalable(new_sandbox: Make):
    me = os.getpid()
    res = run(
        new_sandbox,
        f"""
import glob, os
name = b"py" + b"test"  # not spelled out: this program's own command line holds its source
seen = any(name in open(p, "rb").read() for p in glob.glob("/proc/[0-9]*/cmdline"))
try:
    os.kill({me}, 15); hit = True
except OSError:
    hit = False
print(seen, hit)
""",
    )
    assert res.stdout == "False False\n", res
    host_and_next_sandbox_ok(new_sandbox)


def test_death_by_signal_is_reported(new_sandbox: Make):
    res = run(new_sandbox, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert res.exit_code == 128 + signal.SIGSEGV and not res.timed_out, res
    host_and_next_sandbox_ok(new_sandbox)


# --- memory, disk, files --------------------------------------------------------------------


def test_memory_bomb_is_oom_killed_and_reported(new_sandbox: Make):
    res = run(new_sandbox, "x = bytearray(1 << 30); print('allocated')", timeout=5)
    assert res.oom_killed and "allocated" not in res.stdout, res
    host_and_next_sandbox_ok(new_sandbox)


def test_gradual_memory_growth_is_oom_killed(new_sandbox: Make):
    res = run(new_sandbox, "chunks = []\nwhile True: chunks.append(b'x' * (8 << 20))", timeout=10)
    assert res.oom_killed and not res.timed_out, res
    host_and_next_sandbox_ok(new_sandbox)


def test_disk_fill_of_one_file_is_capped(new_sandbox: Make):
    with new_sandbox() as sb:
        res = sb.run_python(
            "f = open('/work/big', 'wb')\n"
            "try:\n"
            "    while True: f.write(b'x' * (1 << 20)); f.flush()\n"
            "except OSError as e:\n"
            "    print('capped', e.errno)\n",
            timeout=5,
        )
        assert res.stdout.startswith("capped"), res
        used = sb.run("du -sk /work | cut -f1", timeout=5)
    assert int(used.stdout) <= 17 * 1024, used
    host_and_next_sandbox_ok(new_sandbox)


def test_disk_fill_with_many_files_is_capped(new_sandbox: Make):
    with new_sandbox() as sb:
        res = sb.run_python(
            "i = 0\n"
            "try:\n"
            "    while True:\n"
            "        open(f'/work/f{i}', 'wb').write(b'x' * (4 << 20)); i += 1\n"
            "except OSError as e:\n"
            "    print('capped', e.errno)\n",
            timeout=5,
        )
        assert res.stdout.startswith("capped") or "exceeded" in res.stderr, res
        used = sb.run("du -sk /work | cut -f1", timeout=5)
    assert int(used.stdout) <= 17 * 1024, used
    host_and_next_sandbox_ok(new_sandbox)


def test_tmp_fill_is_capped(new_sandbox: Make):
    res = run(
        new_sandbox,
        "i = 0\n"
        "try:\n"
        "    while True: open(f'/tmp/f{i}', 'wb').write(b'x' * (1 << 20)); i += 1\n"
        "except OSError as e:\n"
        "    print('capped after', i)\n",
        timeout=5,
    )
    assert res.stdout.startswith("capped after"), res
    assert int(res.stdout.split()[-1]) <= 16
    host_and_next_sandbox_ok(new_sandbox)


def test_open_file_flood_hits_the_descriptor_limit(new_sandbox: Make):
    res = run(
        new_sandbox,
        "fs = []\ntry:\n    while True: fs.append(open('/dev/null'))\n"
        "except OSError as e:\n    print('capped at', len(fs))\n",
    )
    assert res.stdout.startswith("capped at") and int(res.stdout.split()[-1]) < 300, res
    host_and_next_sandbox_ok(new_sandbox)


def test_host_files_are_not_visible(new_sandbox: Make, tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t-token")
    secret.chmod(0o644)
    res = run(
        new_sandbox,
        f"""
for p in ({str(secret)!r}, "/etc/shadow", "/root/.bash_history"):
    try:
        print(open(p).read())
    except OSError:
        pass
print("done")
""",
    )
    assert "s3cr3t-token" not in res.stdout and res.stdout.endswith("done\n"), res
    host_and_next_sandbox_ok(new_sandbox)


def test_host_environment_is_not_inherited(new_sandbox: Make, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AREAL_TEST_SECRET", "env-s3cr3t")
    res = run(new_sandbox, "import os; print(sorted(os.environ.items()))")
    assert "env-s3cr3t" not in res.stdout and res.ok, res
    host_and_next_sandbox_ok(new_sandbox)


def test_writes_outside_the_work_dir_fail(new_sandbox: Make):
    res = run(
        new_sandbox,
        """
ok = 0
for p in ("/usr/bin/evil", "/etc/evil", "/evil", "/bin/evil", "/proc/sys/kernel/evil"):
    try:
        open(p, "w").write("x"); ok += 1
    except OSError:
        pass
print(ok)
""",
    )
    assert res.stdout == "0\n", res
    host_and_next_sandbox_ok(new_sandbox)


def test_host_paths_are_not_writable(new_sandbox: Make, tmp_path: Path):
    target = tmp_path / "planted"
    tmp_path.chmod(0o777)
    res = run(
        new_sandbox,
        f"try:\n    open({str(target)!r}, 'w').write('x')\nexcept OSError:\n    pass\nprint(1)",
    )
    assert res.ok and not target.exists(), res
    host_and_next_sandbox_ok(new_sandbox)


def test_nothing_leaks_between_episodes(new_sandbox: Make):
    with new_sandbox() as sb:
        sb.run("echo x > /work/leak; echo x > /tmp/leak; echo x > /dev/shm/leak 2>/dev/null")
    with new_sandbox() as sb:
        res = sb.run("ls -A /work /tmp; ls -A /dev/shm 2>/dev/null", timeout=5)
    assert "leak" not in res.stdout, res
    host_and_next_sandbox_ok(new_sandbox)
