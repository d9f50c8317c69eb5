"""Network helpers: a free TCP port for a server or a process-group rendezvous.

>>> 1024 <= free_port() < 65536
True
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (loopback by default).

    The port is only free at the moment of the call: bind it soon, and expect another process
    to take it in between once in a long while.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
