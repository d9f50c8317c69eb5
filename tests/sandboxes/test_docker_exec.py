"""The docker exec layer without an engine: status parsing and module structure."""

from __future__ import annotations

import subprocess
import sys

from areal_agents.sandboxes._docker_exec import never_started, parse_status

MARK = "__areal_status_0123456789abcdef"


def test_the_status_line_is_parsed_at_the_end_of_the_stream():
    tail = b"program output\n" + f"\n{MARK} 3 1 0\n".encode()
    assert parse_status(tail, MARK) == ((3, 1, 0), len(f"\n{MARK} 3 1 0\n"))


def test_a_status_line_followed_by_anything_is_not_believed():
    tail = f"\n{MARK} 0 0 0\nwritten after the status\n".encode()
    assert parse_status(tail, MARK) is None


def test_a_line_with_another_marker_is_not_believed():
    assert parse_status(b"\n__areal_status_guess 0 0 0\n", MARK) is None


def test_a_malformed_status_line_is_not_believed():
    for rest in (b"0 0\n", b"0 0 0", b"x 0 0\n", b"0 0 0 0\n"):
        assert parse_status(b"\n" + MARK.encode() + b" " + rest, MARK) is None, rest


def test_only_runcs_own_start_failure_counts_as_never_started():
    runc = b"OCI runtime exec failed: exec failed: unable to start container process: x\r\n"
    assert never_started(runc, (len(runc), 0), 126)
    assert not never_started(runc, (len(runc), 0), 0)  # another code: something ran
    assert not never_started(runc, (len(runc), 5), 126)  # stderr: the wrapper's status, a run
    assert not never_started(runc, (len(runc) + 9, 0), 126)  # more than was kept
    assert not never_started(b"program output\n" + runc, (len(runc) + 15, 0), 126)
    assert not never_started(runc + b"more\n", (len(runc) + 5, 0), 126)


def test_the_pool_module_does_not_import_the_sandbox_module():
    code = (
        "import sys, areal_agents.sandboxes.docker_pool\n"
        "print('areal_agents.sandboxes.docker' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "False\n"


def test_public_names_stay_where_the_package_imports_them_from():
    from areal_agents.sandboxes.docker import DockerSandbox, docker_problem, reset_container
    from areal_agents.sandboxes.docker_pool import (
        LABEL,
        SANDBOX_USER,
        docker_client,
        owned_containers,
        owner_labels,
        reap_orphans,
        shutdown_all,
    )

    assert SANDBOX_USER == "65534:65534" and LABEL == "areal_agents.sandbox"
    assert all(
        callable(f)
        for f in (
            DockerSandbox,
            docker_problem,
            reset_container,
            docker_client,
            owned_containers,
            owner_labels,
            reap_orphans,
            shutdown_all,
        )
    )
