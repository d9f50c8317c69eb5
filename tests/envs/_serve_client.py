"""A raw HTTP client for the environment server's tests: requests any client could send, bodies
the real client never would, and a check that the server closed a socket."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def post(
    url: str, op: str, body: Any = None, raw: bytes | None = None, headers: Any = None
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(*address(url), timeout=30)
    try:
        data = raw if raw is not None else json.dumps(body or {}).encode()
        conn.request("POST", f"/{op}", body=data, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` within ``within_s`` (reads until EOF or reset)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
