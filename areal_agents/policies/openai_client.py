"""Shared plumbing of the two clients: one ``AsyncOpenAI`` per event loop, bounded concurrency,
a total deadline per request, and retries with exponential backoff on timeouts, connection
errors, malformed replies, 429 and 5xx.

Each attempt must end within ``ClientSettings.timeout`` seconds in all (connect, headers and
the whole body): a server that sends its headers and then one byte a second is cut off at the
deadline, since httpx's own timeouts bound each read, not the request. After the allowed
retries an :class:`~areal_agents.errors.EndpointError` is raised (an infrastructure fault: the
caller drops the episode and counts it; :class:`~areal_agents.errors.MalformedResponseError`
when the last attempt got an answer that was not a well-formed reply). Authentication and
unknown-model answers are configuration errors (:class:`~areal_agents.errors.ConfigError`):
retrying cannot fix them. ``EndpointClient.stats`` counts attempts, retries and each kind of
failure.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import openai

from areal_agents.errors import ConfigError, EndpointError, MalformedResponseError

__all__ = ["ClientSettings", "EndpointClient", "api_key_from_env", "read_body"]

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
    """Seconds one request may take in all, body included, before it counts as a timeout."""
    max_retries: int = 4
    """Retries after the first attempt (timeouts, connection errors, malformed replies, 429,
    5xx)."""
    backoff_s: float = 0.5
    """First retry delay; it doubles on each retry (with jitter), capped at 30 s."""
    max_concurrency: int = 64
    """Requests in flight at once through this client."""
    max_response_bytes: int = 32 << 20
    """Largest reply body read (:func:`read_body`); a larger one is a malformed reply."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url={self.base_url!r}: expected http(s)://host:port/v1")
        if not (isinstance(self.timeout, int | float) and math.isfinite(self.timeout)):
            raise ConfigError(f"timeout={self.timeout!r}: must be a finite number of seconds")
        if self.timeout <= 0:
            raise ConfigError(f"timeout={self.timeout}: must be positive seconds")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"max_retries={self.max_retries!r}: must be 0 or more")
        if not (math.isfinite(self.backoff_s) and self.backoff_s >= 0):
            raise ConfigError(f"backoff_s={self.backoff_s}: must be 0 or more seconds")
        if self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency={self.max_concurrency}: must be at least 1")
        if self.max_response_bytes < 1:
            raise ConfigError(f"max_response_bytes={self.max_response_bytes}: at least 1")


class EndpointClient:
    """An ``AsyncOpenAI`` per event loop, a concurrency bound, the deadline and the retry loop."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.stats: Counter[str] = Counter()
        """``attempts``, ``retries`` and one count per failure kind (``timeout``,
        ``connection``, ``malformed``, ``http_<status>``)."""
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

    async def aclose(self) -> None:
        """Close the running loop's client and its connections (a later call opens a new one).
        Call it before the loop ends: a pool left open is closed by the garbage collector on a
        loop that is gone, which prints ``RuntimeError: Event loop is closed``."""
        entry = self._clients.pop(id(asyncio.get_running_loop()), None)
        self._semaphores.pop(id(asyncio.get_running_loop()), None)
        if entry is not None:
            await entry[1].close()

    async def call(self, what: str, fn: Callable[[openai.AsyncOpenAI], Awaitable[T]]) -> T:
        """Run ``fn(client)`` with the concurrency bound, the deadline and retries.

        ``fn`` may raise :class:`MalformedResponseError` for a reply it cannot use: that
        attempt is retried like a 5xx. Typed errors once the attempts are spent.
        """
        client = self.client()
        semaphore = self._semaphores[id(asyncio.get_running_loop())]
        delay = self.settings.backoff_s
        last: Exception | None = None
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(min(delay, 30.0) * (0.75 + 0.5 * random.random()))
                delay *= 2
            try:
                async with semaphore:
                    self.stats["attempts"] += 1
                    async with asyncio.timeout(self.settings.timeout):
                        return await fn(client)
            except (TimeoutError, openai.APITimeoutError) as e:
                self.stats["timeout"] += 1
                last = e if isinstance(e, openai.APITimeoutError) else self._deadline_error()
            except openai.APIConnectionError as e:
                self.stats["connection"] += 1
                last = e
            except MalformedResponseError as e:
                self.stats["malformed"] += 1
                last = e
            except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
                self.stats[f"http_{e.status_code}"] += 1
                raise ConfigError(
                    f"{what}: {self.settings.base_url} refused the API key: {e}"
                ) from e
            except openai.NotFoundError as e:
                self.stats["http_404"] += 1
                raise ConfigError(f"{what}: {self.settings.base_url}: {_message(e)}") from e
            except openai.APIStatusError as e:
                self.stats[f"http_{e.status_code}"] += 1
                if e.status_code not in _RETRY_STATUS:
                    raise EndpointError(
                        f"{what}: {self.settings.base_url} answered {e.status_code}: {_message(e)}"
                    ) from e
                last = e
        malformed = isinstance(last, MalformedResponseError)
        raise (MalformedResponseError if malformed else EndpointError)(
            f"{what}: {self.settings.base_url} failed after {self.settings.max_retries + 1} "
            f"attempts: {type(last).__name__}: {last}"
        ) from last

    def _deadline_error(self) -> TimeoutError:
        """The error of an attempt cut off by our deadline (not the SDK's ``APITimeoutError``:
        its constructor reads a request object, which a deadline has none of)."""
        return TimeoutError(f"no complete reply within {self.settings.timeout} s")


async def read_body(response: Any, limit: int) -> bytes:
    """The whole body of a streamed SDK response, refusing more than ``limit`` bytes.

    A body that breaks off (a closed connection, a read timeout) raises the SDK's own
    ``APIConnectionError`` / ``APITimeoutError``, as a failure before the headers would.
    """
    declared = str(response.headers.get("content-length", ""))
    if declared.isdigit() and int(declared) > limit:
        raise MalformedResponseError(f"the reply declares {declared} bytes (limit {limit})")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.iter_bytes():
            size += len(chunk)
            if size > limit:
                raise MalformedResponseError(f"the reply is larger than {limit} bytes")
            chunks.append(chunk)
    except MalformedResponseError:
        raise
    except Exception as e:  # the HTTP library's transport errors, whichever library it is
        request = response.http_request
        if "timeout" in type(e).__name__.lower():
            raise openai.APITimeoutError(request=request) from e
        raise openai.APIConnectionError(message=f"the reply broke off: {e}", request=request) from e
    return b"".join(chunks)


def _message(error: openai.APIStatusError, limit: int = 500) -> str:
    """The server's own error message (shortened), else the SDK's."""
    body: Any = error.body
    text = str(error)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and "message" in inner:
            text = str(inner["message"])
        elif "detail" in body:
            text = str(body["detail"])
    return text if len(text) <= limit else text[:limit] + "..."
