"""Programs that attack the run's supervision: its reported status, its time limit, its end.

The status a sandbox reports (exit code, timed out) must come from something the program
cannot write or fake, and nothing the program started may outlive the call, however it tries:
forged status lines, killing or stopping every process it may signal, daemons that keep doing
so. Each test attacks one of these and checks one property.
"""

from __future__ import annotations

import os
import secrets

import pytest

from tests.sandboxes._hostile import Make, host_and_next_sandbox_ok

pytestmark = pytest.mark.timeout(300)

_GRACE_S = 5.0  # docker's safety net acts this long after the limit: the limit itself must act

# Collect anything that looks like a status marker from every process this program can read,
# print forged "exit 0" status lines with each, then SIGKILL every other process it can see
# (the supervisor first of all, so that the real status never gets written) and exit 3.
_FORGER = r"""
import os, re, signal, sys, time
me = os.getpid()
found = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    for part in ("cmdline", "environ"):
        try:
            data = open(f"/proc/{pid}/{part}", "rb").read()
            found.update(re.findall(rb"__areal_status_\w+", data))
        except OSError:
            pass
fake = b"".join(b"\n" + m + b" 0 0 0\n" for m in sorted(found) or [b"__areal_status_x"])
ppids = []
pid = me
while pid > 1:
    try:
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except OSError:
        break
    ppids.append(pid)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open("/dev/null", os.O_RDWR)
        for i in (0, 1, 2):
            os.dup2(fd, i)
        while True:
            with open("/work/alive", "a") as f:
                f.write("x")
            time.sleep(0.02)
    os._exit(0)
time.sleep(0.3)
os.write(2, fake)
for pid in ppids + sorted(int(p) for p in filter(str.isdigit, os.listdir("/proc"))):
    if pid > 1 and pid != me:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
os._exit(3)
"""


def test_a_forged_status_line_does_not_change_the_exit_code(new_sandbox: Make):
    with new_sandbox() as sb:
        res = sb.run_python(_FORGER, timeout=5)
    assert res.exit_code == 3 and not res.timed_out, res
    host_and_next_sandbox_ok(new_sandbox)


def test_nothing_of_a_forging_program_outlives_the_call(new_sandbox: Make):
    with new_sandbox() as sb:
        sb.run_python(_FORGER, timeout=5)
        size_then = len(sb.read_file("alive"))
        check = sb.run("sleep 0.5; wc -c < /work/alive", timeout=5)
    assert int(check.stdout) == size_then, "the forger's daemon kept writing after the call"
    host_and_next_sandbox_ok(new_sandbox)


def test_the_status_marker_is_not_readable_by_the_program(new_sandbox: Make):
    code = r"""
import os, re
hits = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    for part in ("cmdline", "environ"):
        try:
            data = open(f"/proc/{pid}/{part}", "rb").read()
            hits += len(re.findall(rb"__areal_status_\w+", data))
        except OSError:
            pass
print(hits)
"""
    with new_sandbox() as sb:
        res = sb.run_python(code, timeout=5)
    assert res.stdout == "0\n", res


def test_stopping_every_process_does_not_stretch_the_time_limit(new_sandbox: Make):
    with new_sandbox() as sb:
        res = sb.run_python(
            "import os, signal\ntry:\n    os.kill(-1, signal.SIGSTOP)\nexcept OSError:\n"
            "    pass\nwhile True: pass",
            timeout=2,
        )
        again = sb.run("echo ok", timeout=5)
    assert res.timed_out and res.duration_s < 2 + _GRACE_S, res
    assert again.stdout == "ok\n", again
    host_and_next_sandbox_ok(new_sandbox)


_STOPPER = """
import os, signal, time
if os.fork() == 0:
    os.setsid()
    while True:
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(-1, sig if sig == signal.SIGSTOP else 0)
            except OSError:
                pass
time.sleep(0.2)
while True:
    pass
"""


def test_a_daemon_that_keeps_stopping_everything_does_not_stretch_the_time_limit(
    new_sandbox: Make,
):
    with new_sandbox() as sb:
        res = sb.run_python(_STOPPER, timeout=2)
        again = sb.run("echo ok", timeout=5)
    assert res.timed_out and res.duration_s < 2 + _GRACE_S, res
    assert again.stdout == "ok\n", again
    host_and_next_sandbox_ok(new_sandbox)


# Count the processes whose command line holds the tag (written in two parts, so that this
# program's own does not). A process may end between the listing and the read: skip it.
_COUNT_TAGGED = """
import glob
n = 0
for p in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        n += (b"{half}" b"{rest}") in open(p, "rb").read()
    except OSError:
        pass
print(n)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the process backend shares a non-root caller's uid")
def test_process_backend_a_daemon_stopping_its_uid_does_not_stretch_the_time_limit():
    from areal_agents.sandboxes import make_sandbox

    # The daemon's command line carries a tag of this run: the host's /proc also lists other
    # runs' stoppers (other tests, other checkouts), which are not this sandbox's to kill.
    tag = secrets.token_hex(8)
    with make_sandbox("process", memory_mb=256, pids=32) as sb:
        res = sb.run_python(f"{_STOPPER}# {tag}\n", timeout=2)
        again = sb.run("echo ok", timeout=5)
        left = sb.run_python(_COUNT_TAGGED.format(half=tag[:8], rest=tag[8:]), timeout=5)
    assert res.timed_out and res.duration_s < 2 + _GRACE_S, res
    assert again.stdout == "ok\n", again
    assert left.stdout == "0\n", left  # the daemon is gone too
