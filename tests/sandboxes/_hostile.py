"""What the hostile-program suites share: the sandbox factory type, the output cap and checks."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from areal_agents.sandboxes import BaseSandbox, ExecResult

__all__ = ["CAP", "Make", "host_and_next_sandbox_ok", "run"]

Make = Callable[..., BaseSandbox]
CAP = 16 * 1024  # max_output_bytes of the suite (conftest.LIMITS)


def host_and_next_sandbox_ok(make: Make) -> None:
    """The host still forks and answers, and a fresh sandbox runs a program."""
    subprocess.run(["/bin/true"], check=True, timeout=30)
    with make() as fresh:
        res = fresh.run_python("print('ok')", timeout=10)
    assert res.ok and res.stdout == "ok\n", res


def run(make: Make, code: str, timeout: float = 2.0, **limits: int) -> ExecResult:
    with make(**limits) as sb:
        return sb.run_python(code, timeout=timeout)
