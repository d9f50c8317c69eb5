"""Attaching to a Ray cluster: a wrong address fails within ``ray.connect_timeout_s`` with what
to check, instead of Ray's minutes of retries; addresses are parsed as Ray parses them."""

from __future__ import annotations

import socket
import threading

import pytest

from areal_agents.errors import ClusterUnreachableError, ConfigError
from areal_agents.net import free_port
from areal_agents.trainers.cluster import bootstrap_endpoint, wait_for_port
from areal_agents.trainers.config import RayConfig
from areal_agents.trainers.runtime import start_ray


def test_attach_with_nothing_listening_fails_with_what_to_check() -> None:
    port = free_port()
    with pytest.raises(ClusterUnreachableError) as info:
        start_ray(RayConfig(address=f"127.0.0.1:{port}", connect_timeout_s=0.5))
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "ray.connect_timeout_s" in message
    assert "ray status" in message


def test_the_timeout_decides_whether_a_slow_head_is_waited_for() -> None:
    """A head that starts listening after 1.5 s: a short timeout gives up, a long one waits."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threading.Timer(1.5, server.listen).start()
    try:
        with pytest.raises(ClusterUnreachableError):
            wait_for_port("127.0.0.1", port, timeout_s=0.3)
        wait_for_port("127.0.0.1", port, timeout_s=30.0)  # returns once the head listens
    finally:
        server.close()


@pytest.mark.parametrize(
    ("address", "endpoint"),
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379)),
        ("ray://10.0.0.5:10001", ("10.0.0.5", 10001)),
        ("[::1]:6379", ("::1", 6379)),
    ],
)
def test_bootstrap_endpoint(address: str, endpoint: tuple[str, int]) -> None:
    assert bootstrap_endpoint(address) == endpoint


def test_an_address_without_port_is_refused_with_the_forms_accepted() -> None:
    with pytest.raises(ClusterUnreachableError, match="HOST:PORT"):
        bootstrap_endpoint("headnode")


def test_the_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="connect_timeout_s"):
        RayConfig(connect_timeout_s=0)
