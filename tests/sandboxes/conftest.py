"""Fixtures shared by the sandbox tests: backends as parameters, small limits, clean-up checks."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from areal_agents.sandboxes import BaseSandbox, make_sandbox

# Small limits keep the hostile suite fast on 2 cores.
LIMITS = {"memory_mb": 128, "pids": 32, "disk_mb": 16, "max_output_bytes": 16 * 1024}

ISOLATING = [
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
    pytest.param("bubblewrap", marks=pytest.mark.bubblewrap, id="bubblewrap"),
]
EVERY = [*ISOLATING, pytest.param("process", id="process")]


@pytest.fixture(params=ISOLATING)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=EVERY)
def any_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _factory(backend: str) -> Iterator[Callable[..., BaseSandbox]]:
    made: list[BaseSandbox] = []

    def make(**overrides: int) -> BaseSandbox:
        sb = make_sandbox(backend, pool_size=2, **{**LIMITS, **overrides})
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.close()


@pytest.fixture
def new_sandbox(backend: str) -> Iterator[Callable[..., BaseSandbox]]:
    """Make sandboxes of ``backend`` with the suite's limits; all are closed at teardown."""
    yield from _factory(backend)


@pytest.fixture
def any_sandbox(any_backend: str) -> Iterator[Callable[..., BaseSandbox]]:
    """Like ``new_sandbox``, over every backend, the process backend included."""
    yield from _factory(any_backend)


@pytest.fixture(scope="session", autouse=True)
def no_containers_left() -> Iterator[None]:
    """After the sandbox tests, this process owns no container (checked when docker ran)."""
    yield
    from areal_agents.sandboxes import docker_pool

    if docker_pool._client is None:
        return
    docker_pool.shutdown_all()
    left = docker_pool.owned_containers(pid=os.getpid())
    assert left == [], f"containers left behind: {[c.short_id for c in left]}"
