"""Hostile programs against privileges, output and input, on every isolating backend.

The rest of the suite (network, processes, memory, disk, files) is in ``test_hostile.py``;
both follow the same pattern: attack one property, assert it held, then check that the host
still answers and that a fresh sandbox works.
"""

from __future__ import annotations

import os

from tests.sandboxes._hostile import CAP, Make, host_and_next_sandbox_ok, run

# --- privileges -----------------------------------------------------------------------------


def test_setuid_root_is_refused(new_sandbox: Make):
    res = run(
        new_sandbox,
        "import os\ntry:\n    os.setuid(0); print('root')\nexcept OSError:\n"
        "    print('refused', os.getuid())",
    )
    assert res.stdout.startswith("refused") and res.stdout.split()[1] != "0", res
    host_and_next_sandbox_ok(new_sandbox)


def test_no_capabilities_and_no_new_privileges(new_sandbox: Make):
    res = run(
        new_sandbox,
        "f = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "print(int(f['CapEff'], 16), int(f['CapPrm'], 16), f['NoNewPrivs'].strip())",
    )
    assert res.stdout == "0 0 1\n", res
    host_and_next_sandbox_ok(new_sandbox)


def test_mount_is_refused(new_sandbox: Make):
    res = run(
        new_sandbox,
        """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/work/m", exist_ok=True)
rc = libc.mount(b"none", b"/work/m", b"tmpfs", 0, None)
print(rc, ctypes.get_errno())
""",
    )
    assert res.stdout.split()[0] == "-1", res
    host_and_next_sandbox_ok(new_sandbox)


def test_ptrace_of_a_host_process_is_refused(new_sandbox: Make):
    res = run(
        new_sandbox,
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"print(libc.ptrace(16, {os.getpid()}, None, None))",  # PTRACE_ATTACH
    )
    assert res.stdout == "-1\n", res
    host_and_next_sandbox_ok(new_sandbox)


# --- output and input -----------------------------------------------------------------------


def test_stdout_flood_is_capped(new_sandbox: Make):
    res = run(new_sandbox, "import sys\nwhile True: sys.stdout.write('x' * 65536)", timeout=1)
    assert res.truncated and len(res.stdout) <= CAP, (res.truncated, len(res.stdout))
    host_and_next_sandbox_ok(new_sandbox)


def test_stderr_flood_is_capped(new_sandbox: Make):
    res = run(new_sandbox, "import sys\nwhile True: sys.stderr.write('e' * 65536)", timeout=1)
    assert res.truncated and len(res.stderr) <= CAP + 200, (res.truncated, len(res.stderr))
    host_and_next_sandbox_ok(new_sandbox)


def test_binary_output_is_decoded_with_replacements(new_sandbox: Make):
    res = run(new_sandbox, "import sys; sys.stdout.buffer.write(bytes(range(256)))")
    assert res.ok and res.stdout[:128] == "".join(map(chr, range(128))), res
    assert "\ufffd" in res.stdout
    host_and_next_sandbox_ok(new_sandbox)


def test_non_utf8_stderr_is_decoded_with_replacements(new_sandbox: Make):
    res = run(new_sandbox, "import sys; sys.stderr.buffer.write(b'bad \\xff\\xfe end')")
    assert res.ok and res.stderr == "bad \ufffd\ufffd end", res
    host_and_next_sandbox_ok(new_sandbox)


def test_multibyte_character_cut_at_the_cap_is_safe(new_sandbox: Make):
    res = run(new_sandbox, "print('€' * 20000)")  # 60000 bytes, cap 16384: cut mid-character
    assert res.truncated and set(res.stdout) <= {"€", "\ufffd"}, res.stdout[-5:]
    host_and_next_sandbox_ok(new_sandbox)


def test_huge_argument_is_a_result_not_a_crash(new_sandbox: Make):
    with new_sandbox() as sb:
        res = sb.run(["echo", "x" * 300_000], timeout=5)
        assert not res.ok, res  # the kernel refuses arguments this long (E2BIG)
        again = sb.run("echo fine", timeout=5)
    assert again.stdout == "fine\n", again
    host_and_next_sandbox_ok(new_sandbox)


def test_huge_program_source_runs(new_sandbox: Make):
    code = "x = 1\n" * 60_000 + "print('ran', x)"  # 360 KB: passed on stdin, not as argv
    res = run(new_sandbox, code, timeout=10)
    assert res.stdout == "ran 1\n", res
    host_and_next_sandbox_ok(new_sandbox)


def test_reading_stdin_without_input_does_not_hang(new_sandbox: Make):
    res = run(new_sandbox, "input()", timeout=5)
    assert not res.timed_out and "EOFError" in res.stderr, res
    host_and_next_sandbox_ok(new_sandbox)


# --- text no process can receive: a result with exit code 126, the same on every backend ------


def test_a_nul_byte_in_a_program_is_a_result(any_sandbox: Make):
    with any_sandbox() as sb:
        res = sb.run_python("print('a')\x00print('b')", timeout=5)
    assert res.exit_code == 126 and "NUL byte" in res.stderr and res.stdout == "", res


def test_a_nul_byte_in_a_command_or_an_argument_is_a_result(any_sandbox: Make):
    with any_sandbox() as sb:
        shell = sb.run("echo a\x00b", timeout=5)
        argv = sb.run(["echo", "a\x00b"], timeout=5)
        again = sb.run("echo fine", timeout=5)
    for res in (shell, argv):
        assert res.exit_code == 126 and "NUL byte" in res.stderr and res.stdout == "", res
    assert again.stdout == "fine\n", again


def test_a_lone_surrogate_in_a_program_or_stdin_is_a_result(any_sandbox: Make):
    with any_sandbox() as sb:
        code = sb.run_python("print('\ud800')", timeout=5)
        stdin = sb.run("cat", stdin="x\udfff", timeout=5)
    for res in (code, stdin):
        assert res.exit_code == 126 and "not valid UTF-8" in res.stderr, res


def test_an_argument_longer_than_the_kernel_takes_is_refused_alike(any_sandbox: Make):
    with any_sandbox() as sb:
        res = sb.run(["echo", "x" * 200_000], timeout=5)
    assert res.exit_code == 126 and "longer than one argument may be" in res.stderr, res


def test_stdin_the_program_never_reads_is_not_an_error(any_sandbox: Make):
    with any_sandbox() as sb:
        res = sb.run("exit 0", stdin="y" * (8 << 20), timeout=10)
        again = sb.run("echo fine", timeout=5)
    assert res.exit_code == 0 and not res.timed_out, res
    assert again.stdout == "fine\n", again


def test_stdin_and_a_flood_of_output_do_not_block_each_other(any_sandbox: Make):
    # the program writes 1 MB before it reads a byte of its 4 MB of input
    code = (
        "import sys\nsys.stdout.write('o' * (1 << 20)); sys.stdout.flush()\n"
        "sys.exit(0 if len(sys.stdin.read()) == 4 << 20 else 1)"
    )
    with any_sandbox() as sb:
        res = sb.run(["python3", "-c", code], stdin="i" * (4 << 20), timeout=20)
    assert res.exit_code == 0 and not res.timed_out and res.truncated, res
