"""State an episode leaves behind, one kind per test: ``reset()`` must leave nothing of it.

Each test plants one kind of state in one call, resets the sandbox, and looks for it in the
next call (on docker the same container is reset in place; the warm pool's reset between
episodes is the same routine, see ``test_docker.py``). Deep trees are planted too: building,
resetting and closing a sandbox with one must work on every backend.
"""

from __future__ import annotations

import os

import pytest

from areal_agents.sandboxes import BaseSandbox
from tests.sandboxes._hostile import Make, host_and_next_sandbox_ok

pytestmark = pytest.mark.timeout(300)

_MQ = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
if sys.argv[1] == "plant":
    fd = libc.mq_open(b"/episode_secret", 0o100 | 0o2, 0o666, None)
    msg = b"answer=42"
    print(fd >= 0 and libc.mq_send(fd, msg, len(msg), 0) == 0)
else:
    fd = libc.mq_open(b"/episode_secret", 0o2 | 0o4000, 0, None)
    names = os.listdir("/dev/mqueue") if os.path.isdir("/dev/mqueue") else []
    print(fd >= 0, names)
"""


def _py(sb: BaseSandbox, code: str, *args: str) -> str:
    sb.write_file("probe.py", code)
    res = sb.run(["python3", "probe.py", *args], timeout=10)
    assert res.exit_code == 0, res
    return res.stdout


def test_posix_message_queue_does_not_survive_reset(new_sandbox: Make):
    with new_sandbox() as sb:
        assert _py(sb, _MQ, "plant") == "True\n"
        sb.reset()
        assert _py(sb, _MQ, "look") == "False []\n"


def test_sysv_ipc_objects_do_not_survive_reset(new_sandbox: Make):
    code = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
if sys.argv[1] == "plant":
    ids = (libc.shmget(0x5eed, 4096, 0o1666), libc.msgget(0x5eed, 0o1666),
           libc.semget(0x5eed, 1, 0o1666))
    print(all(i >= 0 for i in ids))
else:
    print(sum(len(open(f"/proc/sysvipc/{k}").readlines()) - 1 for k in ("shm", "msg", "sem")))
"""
    with new_sandbox() as sb:
        assert _py(sb, code, "plant") == "True\n"
        sb.reset()
        assert _py(sb, code, "look") == "0\n"


def test_extended_attributes_and_acls_of_the_work_dir_do_not_survive_reset(new_sandbox: Make):
    code = """
import os, struct, sys
if sys.argv[1] == "plant":
    os.setxattr("/work", "user.note", b"from episode A: secret=7731")
    entry = lambda tag, perm: struct.pack("<HHI", tag, perm, 0xFFFFFFFF)
    acl = struct.pack("<I", 2) + entry(1, 7) + entry(4, 7) + entry(0x20, 7)
    try:
        os.setxattr("/work", "system.posix_acl_default", acl)  # new files: mode from the ACL
    except OSError:
        pass
    print("user.note" in os.listxattr("/work"))
else:
    print(os.listxattr("/work"))
"""
    with new_sandbox() as sb:
        assert _py(sb, code, "plant") == "True\n"
        sb.reset()
        assert _py(sb, code, "look") == "[]\n"


def test_work_dir_mode_does_not_survive_reset(new_sandbox: Make):
    with new_sandbox() as sb:
        assert sb.run("chmod 0777 /work && stat -c %a /work", timeout=5).stdout == "777\n"
        sb.reset()
        assert sb.run("stat -c %a /work", timeout=5).stdout == "700\n"


def test_an_unreadable_work_dir_does_not_break_reset(new_sandbox: Make):
    with new_sandbox() as sb:
        sb.write_file("a.txt", "x")
        sb.run("chmod 000 /work", timeout=5)
        sb.reset()
        res = sb.run("stat -c %a /work; ls -A /work", timeout=5)
    assert res.stdout == "700\n", res


def test_work_dir_times_do_not_survive_reset(new_sandbox: Make):
    planted = 1_893_456_000  # 2030-01-01: a value an episode chose, to pass a message on
    with new_sandbox() as sb:
        sb.run(f"touch -d @{planted} /work", timeout=5)
        assert sb.run("stat -c %Y /work", timeout=5).stdout == f"{planted}\n"
        sb.reset()
        times = sb.run("stat -c '%X %Y' /work", timeout=5).stdout.split()
    assert str(planted) not in times, times


def test_hidden_and_unwritable_leftovers_do_not_survive_reset(new_sandbox: Make):
    plant = (
        "for d in /work /tmp /dev/shm; do [ -w $d ] || continue;"
        " mkdir -p $d/.h/locked/deeper && touch $d/.h/locked/deeper/f $d/..dots $d/-rf"
        " && chmod 000 $d/.h/locked/deeper $d/.h/locked && chmod 500 $d/.h; done; echo ok"
    )
    with new_sandbox() as sb:
        assert sb.run(plant, timeout=5).stdout == "ok\n"
        sb.reset()
        res = sb.run("ls -A /work /tmp; ls -A /dev/shm 2>/dev/null", timeout=5)
    assert ".h" not in res.stdout and "dots" not in res.stdout and "-rf" not in res.stdout, res


_DEEP = """
import os
for _ in range({depth}):
    os.mkdir("{name}")
    os.chdir("{name}")
open("leaf", "w").write("x")
print(len(os.getcwd()))
"""


def _plant_deep_tree(sb: BaseSandbox, depth: int = 1100) -> None:
    # deeper than Python's recursion limit; its paths (12 KB) are longer than PATH_MAX
    res = sb.run_python(_DEEP.format(depth=depth, name="d" * 10), timeout=60)
    assert res.exit_code == 0 and int(res.stdout) > 4096, res


def test_a_deep_tree_does_not_break_the_next_call(new_sandbox: Make):
    with new_sandbox() as sb:
        _plant_deep_tree(sb)
        res = sb.run_python("import os; print(os.listdir('.'))", timeout=10)
    assert res.stdout == "['dddddddddd']\n", res


def test_a_deep_tree_does_not_survive_reset(new_sandbox: Make):
    with new_sandbox() as sb:
        _plant_deep_tree(sb)
        sb.run("chmod 000 dddddddddd", timeout=5)
        sb.reset()
        assert sb.run("ls -A /work", timeout=5).stdout == ""
    host_and_next_sandbox_ok(new_sandbox)


def test_a_deep_tree_does_not_stop_close_from_removing_everything(new_sandbox: Make):
    sb = new_sandbox()
    _plant_deep_tree(sb)
    host_dir = getattr(sb, "_root", None)  # the daemon-less backends' host directory
    sb.close()
    if host_dir is not None:
        assert not os.path.exists(host_dir)
    host_and_next_sandbox_ok(new_sandbox)
