"""The errors the environment server answers with, and how an environment's exception becomes one.

:class:`RequestError` carries an HTTP status, an error type and a message; both transports of
``python -m areal_agents.envs.serve`` send it as ``{"error": {"type": ..., "message": ...}}``.
:func:`as_request_error` maps what an environment call raised onto it: infrastructure faults are
503, ``ResetNeeded`` 409, configuration errors 422, bad arguments 400, anything else 500.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from areal_agents.errors import ConfigError, InfrastructureError

__all__ = ["RequestError", "as_request_error", "request_id_of"]

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A request that cannot be served: an HTTP status, an error type and a message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, "message": self.message}}


def request_id_of(body: Mapping[str, Any]) -> str | None:
    """The request's ``request_id`` (``None`` when absent or empty); not a string is a 400."""
    value = body.get("request_id")
    if value is not None and not isinstance(value, str):
        raise RequestError(400, "BadRequest", "'request_id' must be a string or null")
    return value or None


def as_request_error(e: BaseException) -> RequestError:
    """The answer to an exception raised by an environment call."""
    if isinstance(e, RequestError):
        return e
    text = f"{e}" or type(e).__name__
    if isinstance(e, InfrastructureError):
        return RequestError(503, type(e).__name__, text)
    if isinstance(e, gym.error.ResetNeeded):
        return RequestError(409, "ResetNeeded", text)
    if isinstance(e, ConfigError):
        return RequestError(422, type(e).__name__, text)
    if isinstance(e, TypeError | ValueError | KeyError | gym.error.Error):
        kind = "ValueError" if isinstance(e, KeyError) else type(e).__name__
        return RequestError(400, kind, text)
    logger.error("the environment raised", exc_info=e)
    return RequestError(500, "EnvironmentError", f"{type(e).__name__}: {text}")
