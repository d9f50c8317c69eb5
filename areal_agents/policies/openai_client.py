"""Shared plumbing of the two clients: one ``AsyncOpenAI`` per event loop, bounded concurrency,
and retries with exponential backoff on timeouts, connection errors, 429 and 5xx.

After the allowed retries an :class:`~areal_agents.errors.EndpointError` is raised (an
infrastructure fault: the caller drops the episode and counts it). Authentication and
unknown-model answers are configuration errors (:class:`~areal_agents.errors.ConfigError`):
retrying cannot fix them.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import openai

from areal_agents.errors import ConfigError, EndpointError

__all__ = ["ClientSettings", "EndpointClient", "api_key_from_env"]

T = TypeVar("T")
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


def api_key_from_env() -> str:
    """``AREAL_API_KEY``, else ``OPENAI_API_KEY``, else a placeholder (local servers need none)."""
    return os.environ.get("AREAL_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"


@dataclass(frozen=True)
class ClientSettings:
    """How to reach an endpoint and how hard to try."""

    base_url: str
    api_key: str | None = None
    """None reads ``AREAL_API_KEY`` / ``OPENAI_API_KEY`` from the environment."""
    timeout: float = 120.0
    """Seconds for one request before it counts as a timeout."""
    max_retries: int = 4
    """Retries after the first attempt (timeouts, connection errors, 429, 5xx)."""
    backoff_s: float = 0.5
    """First retry delay; it doubles on each retry (with jitter), capped at 30 s."""
    max_concurrency: int = 64
    """Requests in flight at once through this client."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url={self.base_url!r}: expected http(s)://host:port/v1")
        if self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency={self.max_concurrency}: must be at least 1")


class EndpointClient:
    """An ``AsyncOpenAI`` per event loop, a concurrency bound, and the retry loop."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, openai.AsyncOpenAI]] = {}
        self._semaphores: dict[int, asyncio.Semaphore] = {}

    def client(self) -> openai.AsyncOpenAI:
        """The ``AsyncOpenAI`` for the running loop (an httpx pool cannot cross loops)."""
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = openai.AsyncOpenAI(
                base_url=self.settings.base_url,
                api_key=self.settings.api_key or api_key_from_env(),
                timeout=self.settings.timeout,
                max_retries=0,  # retried here, with our own backoff and typed errors
            )
            entry = (loop, client)
            self._clients[id(loop)] = entry
            self._semaphores[id(loop)] = asyncio.Semaphore(self.settings.max_concurrency)
        return entry[1]

    async def call(self, what: str, fn: Callable[[openai.AsyncOpenAI], Awaitable[T]]) -> T:
        """Run ``fn(client)`` with the concurrency bound and retries; typed errors at the end."""
        client = self.client()
        semaphore = self._semaphores[id(asyncio.get_running_loop())]
        delay = self.settings.backoff_s
        last: Exception | None = None
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                await asyncio.sleep(min(delay, 30.0) * (0.75 + 0.5 * random.random()))
                delay *= 2
            try:
                async with semaphore:
                    return await fn(client)
            except (openai.APITimeoutError, openai.APIConnectionError) as e:
                last = e
            except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
                raise ConfigError(
                    f"{what}: {self.settings.base_url} refused the API key: {e}"
                ) from e
            except openai.NotFoundError as e:
                raise ConfigError(f"{what}: {self.settings.base_url}: {_message(e)}") from e
            except openai.APIStatusError as e:
                if e.status_code not in _RETRY_STATUS:
                    raise EndpointError(
                        f"{what}: {self.settings.base_url} answered {e.status_code}: {_message(e)}"
                    ) from e
                last = e
        raise EndpointError(
            f"{what}: {self.settings.base_url} failed after {self.settings.max_retries + 1} "
            f"attempts: {type(last).__name__}: {last}"
        ) from last


def _message(error: openai.APIStatusError) -> str:
    body: Any = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(error)
