"""The built-in server's error bodies (OpenAI's ``{"error": {...}}`` shape) and its API-key
guard, shared by the routes of :mod:`areal_agents.serving.api`."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

__all__ = ["ApiKeyGuard", "error_response"]


def error_response(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """An OpenAI-shaped error body with HTTP ``status``; ``kind`` is its ``type``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


class ApiKeyGuard:
    """ASGI middleware: ``/v1/`` routes need ``Authorization: Bearer <api_key>``."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("path", "").startswith("/v1/"):
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != self.expected:
                response = error_response(401, "invalid or missing API key", "AuthenticationError")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
