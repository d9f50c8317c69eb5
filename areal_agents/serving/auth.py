"""The inference servers' API key, at both ends (standard library only: learner ranks import it).

A server started with a key (the built-in server's ``--api-key``, else the environment variable
:data:`SERVER_API_KEY_ENV`; vLLM's ``VLLM_API_KEY``, which :class:`~areal_agents.serving.vllm.
VLLMServer` sets from the same variable) wants ``Authorization: Bearer KEY`` on every route but
``GET /health``: the OpenAI routes and the training routes (``/pause``, ``/update_weights`` ...)
alike, since whoever can push weights or pause the engine controls what the policy says.

This package's own clients of those routes (:class:`~areal_agents.serving.server.
BuiltinServerClient`, :class:`~areal_agents.serving.vllm.VLLMServer`, the weight-transfer client)
send :func:`auth_headers`. The policies' OpenAI clients read their key from ``AREAL_API_KEY``
(:mod:`areal_agents.policies.openai_client`): a keyed server needs it there too.

An environment variable rather than a flag keeps the key out of the process list, which every
local user can read.
"""

from __future__ import annotations

import hmac
import os

__all__ = ["SERVER_API_KEY_ENV", "auth_headers", "bearer_matches", "server_api_key"]

SERVER_API_KEY_ENV = "AREAL_SERVER_API_KEY"
"""The environment variable holding an inference server's API key (both ends)."""


def server_api_key(given: str | None = None) -> str | None:
    """``given``, else :data:`SERVER_API_KEY_ENV`; None when neither is set (or empty)."""
    key = given if given is not None else os.environ.get(SERVER_API_KEY_ENV)
    return key or None


def auth_headers(given: str | None = None) -> dict[str, str]:
    """``{"Authorization": "Bearer KEY"}`` for :func:`server_api_key`; ``{}`` without a key.

    >>> auth_headers("s3cret")
    {'Authorization': 'Bearer s3cret'}
    """
    key = server_api_key(given)
    return {"Authorization": f"Bearer {key}"} if key else {}


def bearer_matches(value: bytes | None, key: str) -> bool:
    """Whether the ``Authorization`` header ``value`` is ``Bearer KEY`` (constant time).

    >>> bearer_matches(b"Bearer k", "k"), bearer_matches(b"Bearer kk", "k")
    (True, False)
    """
    return hmac.compare_digest(value or b"", f"Bearer {key}".encode())
