"""Sandboxes for model-written code: Docker (with a warm pool), bubblewrap, plain process.

``make_sandbox()`` returns one sandbox per episode::

    with make_sandbox() as sb:          # docker if a daemon answers, else bubblewrap, else process
        sb.write_file("sol.py", code)
        result = sb.run("python3 sol.py", timeout=5)
"""

from areal_agents.sandboxes.base import BaseSandbox, ExecResult, Sandbox, SandboxLimits
from areal_agents.sandboxes.factory import BACKENDS, backend_problems, make_sandbox, pick_backend

__all__ = [
    "BACKENDS",
    "BaseSandbox",
    "ExecResult",
    "Sandbox",
    "SandboxLimits",
    "backend_problems",
    "make_sandbox",
    "pick_backend",
]
