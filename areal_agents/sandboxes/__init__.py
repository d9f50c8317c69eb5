"""Sandboxes for model-written code: Docker (with a warm pool), bubblewrap, plain process.

``make_sandbox()`` returns one sandbox per episode::

    with make_sandbox() as sb:          # docker if a daemon answers, else bubblewrap, else process
        sb.write_file("sol.py", code)
        result = sb.run("python3 sol.py", timeout=5)

In a coroutine: ``sb = await amake_sandbox()``, then ``await sb.arun_python(code)`` and
``await sb.aclose()`` (blocking calls run in worker threads). A process that is about to end
without its ``atexit`` hooks (a killed Ray actor) calls :func:`shutdown_sandboxes` first.
"""

import sys

from areal_agents.sandboxes.base import BaseSandbox, ExecResult, Sandbox, SandboxLimits
from areal_agents.sandboxes.factory import (
    BACKENDS,
    amake_sandbox,
    backend_problems,
    make_sandbox,
    pick_backend,
)

__all__ = [
    "BACKENDS",
    "BaseSandbox",
    "ExecResult",
    "Sandbox",
    "SandboxLimits",
    "amake_sandbox",
    "backend_problems",
    "make_sandbox",
    "pick_backend",
    "shutdown_sandboxes",
]


def shutdown_sandboxes() -> None:
    """Release what sandboxes this process still holds: shut the Docker warm pools down and
    remove the containers it owns, if the Docker backend was used (it is not imported here)."""
    pool = sys.modules.get("areal_agents.sandboxes.docker_pool")
    if pool is not None:
        pool.shutdown_all()
