"""``make_sandbox``: one call that picks a backend and returns a ready sandbox.

>>> with make_sandbox("process", memory_mb=256) as sb:
...     sb.run_python("print(6 * 7)").stdout
'42\\n'
"""

from __future__ import annotations

import asyncio
import functools
import shutil
from typing import Any

from areal_agents.errors import ConfigError, SandboxUnavailableError, did_you_mean
from areal_agents.sandboxes.base import BaseSandbox, SandboxLimits

__all__ = ["BACKENDS", "amake_sandbox", "backend_problems", "make_sandbox", "pick_backend"]

BACKENDS = ("auto", "docker", "bubblewrap", "process")


def docker_problem(image: str | None = None) -> str | None:
    """None when a Docker engine answers and the sandbox image exists, else the reason."""
    try:
        from areal_agents.sandboxes.docker import docker_problem as problem
    except ImportError as e:
        return f"docker backend unavailable: {e}"
    return problem(image)


@functools.cache
def bubblewrap_problem() -> str | None:
    """None when ``bwrap`` can create its namespaces here, else the reason."""
    from areal_agents.sandboxes.bubblewrap import bubblewrap_problem as problem

    return problem()


def backend_problems(image: str | None = None) -> dict[str, str | None]:
    """For each concrete backend, None if it works here, else why not."""
    return {
        "docker": docker_problem(image),
        "bubblewrap": bubblewrap_problem(),
        "process": None if shutil.which("sh") else "no /bin/sh",
    }


def pick_backend(image: str | None = None) -> str:
    """What ``backend="auto"`` chooses: docker, else bubblewrap, else process."""
    if docker_problem(image) is None:
        return "docker"
    if bubblewrap_problem() is None:
        return "bubblewrap"
    return "process"


def make_sandbox(
    backend: str = "auto",
    *,
    image: str | None = None,
    pool_size: int | None = None,
    **limits: Any,
) -> BaseSandbox:
    """A sandbox for one episode; use it as a context manager (``close`` releases it).

    ``backend``: ``"docker"`` (a container from the warm pool), ``"bubblewrap"`` (namespaces, no
    daemon), ``"process"`` (rlimits only, **not isolation**) or ``"auto"`` (the first of those that
    works here; falling back to ``process`` warns once). ``limits`` are :class:`SandboxLimits`
    fields (``memory_mb``, ``cpus``, ``pids``, ``disk_mb``, ``max_output_bytes``, ``open_files``).
    ``image`` and ``pool_size`` apply to docker only (defaults: ``$AREAL_SANDBOX_IMAGE`` or
    ``areal-agents-sandbox:latest``; ``$AREAL_SANDBOX_POOL_SIZE`` or 2).
    """
    if backend not in BACKENDS:
        raise ConfigError(
            f"unknown sandbox backend {backend!r}{did_you_mean(backend, BACKENDS)}; "
            f"choose one of {', '.join(BACKENDS)}"
        )
    lim = SandboxLimits.from_kwargs(limits)
    if backend == "auto":
        backend = pick_backend(image)
        if backend == "process":
            from areal_agents.sandboxes.process import warn_not_isolated

            warn_not_isolated()
    if backend == "docker":
        from areal_agents.sandboxes.docker import DockerSandbox

        return DockerSandbox.acquire(lim, image=image, pool_size=pool_size)
    if backend == "bubblewrap":
        problem = bubblewrap_problem()
        if problem is not None:
            raise SandboxUnavailableError(f"bubblewrap backend unavailable: {problem}")
        from areal_agents.sandboxes.bubblewrap import BubblewrapSandbox

        return BubblewrapSandbox(lim)
    from areal_agents.sandboxes.process import ProcessSandbox

    return ProcessSandbox(lim)


async def amake_sandbox(
    backend: str = "auto",
    *,
    image: str | None = None,
    pool_size: int | None = None,
    **limits: Any,
) -> BaseSandbox:
    """:func:`make_sandbox` in a worker thread, for coroutines (a cold container start blocks)."""
    return await asyncio.to_thread(
        make_sandbox, backend, image=image, pool_size=pool_size, **limits
    )
