"""Attaching to an existing Ray cluster (``ray.address=...``).

Where the run's actors go on it is the placement group of ``trainers/placement.py``.

Why a plain ``ray.init(address="127.0.0.1:PORT")`` hung against a cluster started on loopback:
Ray rewrites a loopback bootstrap address into the machine's network address ("remotely
reachable") unless clusters are disabled, which it decides from
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when ``ray`` is imported; the driver then retried the GCS
at ``<network address>:PORT``, where nothing listens, for minutes. :func:`attach_ray` keeps a
loopback address on loopback (:func:`loopback_only`) and first waits at most
``ray.connect_timeout_s`` for the GCS port to accept a connection, so that a wrong address
fails with a message instead of retrying forever.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from typing import Any

from areal_agents.errors import ClusterUnreachableError
from areal_agents.trainers.config import RayConfig

__all__ = ["attach_ray", "bootstrap_endpoint", "loopback_only", "wait_for_port"]

logger = logging.getLogger(__name__)


def loopback_only() -> None:
    """Keep this process's Ray on 127.0.0.1 (node address and bootstrap address).

    Ray turns ``_node_ip_address="127.0.0.1"`` (and a ``127.0.0.1:PORT`` bootstrap address)
    into the machine's network address unless clusters are disabled, which it decides from
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when ``ray`` is first imported: the variable is set
    for the processes Ray starts, and the constant for this one (imported long before).
    """
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def bootstrap_endpoint(address: str) -> tuple[str, int]:
    """``(host, port)`` that ``address`` connects to first (the GCS, or a Ray Client server).

    ``auto`` is resolved the way Ray resolves it (``RAY_ADDRESS``, then the machine's record of
    the latest ``ray start``). Raises :class:`ClusterUnreachableError` when it names nothing.
    """
    target: str | None = address
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            target = get_ray_address_from_environment("auto", None)
        except Exception:  # Ray raises ConnectionError and others when it finds nothing
            target = None
        if not target or target == "auto":
            raise ClusterUnreachableError(
                "ray.address=auto: no running Ray cluster is recorded on this machine; start "
                "one (ray start --head) or give ray.address=HOST:PORT of its head node"
            )
    assert target is not None
    host_port = target.removeprefix("ray://").rsplit("/", 1)[0]
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterUnreachableError(
            f"ray.address={address!r}: expected HOST:PORT (the head's GCS port, 6379 by "
            "default), ray://HOST:PORT or auto"
        )
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    """Return once ``host:port`` accepts a TCP connection; raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClusterUnreachableError(
                f"ray.address: nothing accepted a connection at {host}:{port} within "
                f"{timeout_s:g}s (ray.connect_timeout_s; last error: {last}). Check that the "
                "head node runs (`ray status` there), that the address is the head's GCS port "
                "(6379 unless `ray start --head --port` said otherwise) and that this machine "
                "can reach it (firewall, the head's --node-ip-address)"
            )
        try:
            with socket.create_connection((host, port), timeout=min(left, 2.0)):
                return
        except OSError as e:
            last = e
            time.sleep(min(0.2, max(left, 0.0)))


def attach_ray(cfg: RayConfig, runtime_env: dict[str, Any]) -> None:
    """``ray.init`` on the cluster at ``cfg.address``, failing within ``cfg.connect_timeout_s``."""
    import ray

    assert cfg.address
    host, port = bootstrap_endpoint(cfg.address)
    kwargs: dict[str, Any] = {}
    if _is_loopback(host):  # a cluster on this machine's loopback: stay there
        loopback_only()
        kwargs["_node_ip_address"] = "127.0.0.1"
    wait_for_port(host, port, cfg.connect_timeout_s)
    address = cfg.address if cfg.address.startswith("ray://") else f"{host}:{port}"
    ray.init(address=address, runtime_env=runtime_env, logging_level=logging.WARNING, **kwargs)
