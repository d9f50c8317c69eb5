"""shutdown_sandboxes(): how a process releases its sandboxes before it ends."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import os, sys
from areal_agents.sandboxes import make_sandbox, shutdown_sandboxes
shutdown_sandboxes()  # nothing used yet: a no-op that imports no backend
assert "areal_agents.sandboxes.docker_pool" not in sys.modules
with make_sandbox("docker", pool_size=1, memory_mb=128, pids=32) as sb:
    assert sb.run("echo hi").stdout == "hi\\n"
from areal_agents.sandboxes.docker_pool import owned_containers
assert owned_containers(pid=os.getpid()), "the warm pool keeps the container for reuse"
shutdown_sandboxes()
print(len(owned_containers(pid=os.getpid())))
"""


@pytest.mark.docker
def test_shutdown_removes_the_warm_pool_containers_of_this_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
