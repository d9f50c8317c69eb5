"""What the environment server accepts from a client's request, checked before it reaches an
environment (every refusal is a :class:`~areal_agents.envs.request_errors.RequestError`).

The server trusts its own configuration and the environments it serves; a client's request
may choose among what they offer, not extend it:

* **Tasks carry no code** (:func:`check_task`). A task a client sends may set the prompt and the
  answer; one that carries a field the graders execute (:data:`CODE_TASK_KEYS`) is refused
  unless the server trusts its clients with code.
* **Keyword arguments** (:func:`check_kwargs`): only the keys the server allows, never one the
  server fixed.
* **Seeds** (:func:`check_seed`): integers in ``[0, 2**128)``.
* **Request ids** (:func:`fingerprint`, :func:`check_same_request`): a retry must repeat its
  request; the same id with another body is ``409``, so a reused id never hands one client
  another's session or result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any

from areal_agents.envs.registry import ALIASES
from areal_agents.envs.request_errors import RequestError

__all__ = [
    "CODE_TASK_KEYS",
    "canonical_env_id",
    "check_env_id",
    "check_kwargs",
    "check_same_request",
    "check_seed",
    "check_task",
    "fingerprint",
]

#: Task fields the graders execute or evaluate: the unit tests and their preamble (run as trusted
#: code by the host-side judge, :mod:`areal_agents.rewards.code`; ``test`` and ``prompt_code``
#: are their other names) and a reasoning-gym entry (handed to its dataset's own scorer,
#: :mod:`areal_agents.rewards.logic`).
CODE_TASK_KEYS = frozenset({"tests", "test", "preamble", "prompt_code", "entry"})

MAX_SEED = 2**128
"""Seeds are below this (numpy's seeding takes any non-negative int; a bigger one is a mistake)."""


def canonical_env_id(name: str) -> str:
    """The Gymnasium id ``name`` stands for: aliases resolved, a ``module:`` prefix dropped.

    >>> canonical_env_id("calculator"), canonical_env_id("acme.tasks:acme/Echo-v0")
    ('areal_agents/Calculator-v0', 'acme/Echo-v0')
    """
    name = ALIASES.get(name, name)
    return name.rpartition(":")[2] if ":" in name else name


def check_seed(seed: Any) -> None:
    """A seed is null or an integer in ``[0, MAX_SEED)`` (400 otherwise)."""
    if seed is None:
        return
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < MAX_SEED:
        shown = "out of range" if isinstance(seed, int) else f"{seed!r:.40}"
        raise RequestError(
            400, "BadRequest", f"'seed' must be an integer in [0, 2**128) or null ({shown})"
        )


def check_task(options: Any, code_keys: Collection[str], trusted: bool) -> None:
    """Refuse (403 ``TaskNotAllowed``) a task in ``options`` that has one of ``code_keys``,
    unless client tasks are ``trusted``.

    >>> check_task({"task": {"prompt": "2+2?", "answer": 4}}, CODE_TASK_KEYS, False)
    >>> check_task({"task": {"prompt": "p", "tests": ["assert f()"]}}, CODE_TASK_KEYS, False)
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    areal_agents.envs.request_errors.RequestError: the task carries tests: code that ...
    """
    if options is not None and not isinstance(options, Mapping):
        raise RequestError(400, "BadRequest", "'options' must be an object or null")
    task = (options or {}).get("task")
    if trusted or not isinstance(task, Mapping):
        return
    code = sorted(k for k in task if isinstance(k, str) and k in code_keys)
    if code:
        raise RequestError(
            403,
            "TaskNotAllowed",
            f"the task carries {', '.join(code)}: code that this server would run on its "
            "host, and it runs no client's code. Name a task the server has (options={'task_id': "
            "...}) or a seed, or start the server with --trust-client-tasks if every client "
            "may run code as its user",
        )


def check_env_id(wanted: Any, env_id: str, env_name: str) -> None:
    """A request that names an environment names the served one (404 otherwise)."""
    if wanted in (None, ""):
        return
    if not isinstance(wanted, str) or canonical_env_id(wanted) != canonical_env_id(env_id):
        raise RequestError(
            404,
            "UnknownEnvironment",
            f"this server serves {env_name!r} ({canonical_env_id(env_id)}), not {wanted!r:.200}",
        )


def check_kwargs(given: Any, fixed: Mapping[str, Any], allowed: Collection[str]) -> dict[str, Any]:
    """The ``gym.make`` arguments: the server's ``fixed`` ones plus the client's ``given`` ones,
    each a key the server ``allowed`` (``"*"``: any) and none changing a fixed one (403)."""
    given = given or {}
    if not isinstance(given, dict):
        raise RequestError(400, "BadRequest", "'kwargs' must be an object")
    for key in given:
        if key in fixed and given[key] != fixed[key]:
            raise RequestError(
                403,
                "KwargNotAllowed",
                f"{key}={fixed[key]!r} is fixed by the server; drop it "
                "from the client's environment arguments",
            )
        if "*" not in allowed and key not in allowed:
            raise RequestError(
                403,
                "KwargNotAllowed",
                f"clients may not set {key!r:.80} (allowed: {', '.join(sorted(allowed))}"
                f"); set it on the server (--env-kwargs) or allow it (--client-kwargs {key:.80})",
            )
    return {**fixed, **given}


def fingerprint(body: Mapping[str, Any]) -> str:
    """What a request asks for, without its ids (a WebSocket retry has a new message id)."""
    content = {k: v for k, v in body.items() if k not in ("id", "op", "request_id")}
    text = json.dumps(content, sort_keys=True, default=repr, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def check_same_request(request_id: str, first: str, body: Mapping[str, Any]) -> None:
    """A request id names one request: ``body`` must be the request whose :func:`fingerprint`
    is ``first`` (409 ``RequestIdReused`` otherwise)."""
    if fingerprint(body) != first:
        raise RequestError(
            409,
            "RequestIdReused",
            f"request_id {request_id!r:.80} was used before for another request; "
            "give each request a new id (RemoteEnv uses random ones)",
        )
