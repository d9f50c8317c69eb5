"""The built-in environments, their registration, and the short names the command lines accept.

:data:`BUILTIN_ENVS` is the one list of built-in environments: short name, Gymnasium id, entry
point and the turn budget of the trainer's ``env=NAME`` preset. They are registered with
:func:`gymnasium.register` under the namespace ``areal_agents/`` by
:func:`register_builtin_envs`, which runs when ``areal_agents`` is imported (this module
imports Gymnasium and no environment: entry points are strings) and in :func:`make_env`. Any
environment a user registers with plain ``gym.register`` works wherever a built-in one does,
because every name ends up in ``gym.make``.
:func:`resolve_env_id` turns a short name (``code_sandbox``) into its id, and passes anything
else through untouched (including Gymnasium's ``module:Env-v0`` form, which imports the user's
module first).

>>> resolve_env_id("calculator")
'areal_agents/Calculator-v0'
>>> resolve_env_id("acme/MyTask-v0")
'acme/MyTask-v0'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from areal_agents.errors import UnknownEnvironmentError, did_you_mean

__all__ = [
    "ALIASES",
    "BUILTIN_ENVS",
    "BuiltinEnv",
    "builtin_env",
    "make_env",
    "register_builtin_envs",
    "resolve_env_id",
]


@dataclass(frozen=True)
class BuiltinEnv:
    """One built-in environment."""

    alias: str
    """The short name the command lines accept (``env=calculator``)."""
    id: str
    """The Gymnasium id (``areal_agents/Calculator-v0``)."""
    entry_point: str
    """``module:Class`` of the environment."""
    train_max_turns: int
    """Assistant turns per episode in the trainer's ``env=ALIAS`` preset (small CPU machines)."""


#: Every built-in environment, once.
BUILTIN_ENVS: tuple[BuiltinEnv, ...] = (
    BuiltinEnv(
        "calculator", "areal_agents/Calculator-v0", "areal_agents.envs.calculator:CalculatorEnv", 2
    ),
    BuiltinEnv(
        "code_sandbox",
        "areal_agents/CodeSandbox-v0",
        "areal_agents.envs.code_sandbox:CodeSandboxEnv",
        2,
    ),
    BuiltinEnv(
        "math_python",
        "areal_agents/MathPython-v0",
        "areal_agents.envs.math_python:MathPythonEnv",
        2,
    ),
    # search: its synthetic questions take up to 3 hops, one search each, then the answer
    BuiltinEnv("search", "areal_agents/Search-v0", "areal_agents.envs.search:SearchEnv", 4),
)

#: short name -> id, as used on the command line (``env=calculator``).
ALIASES: dict[str, str] = {env.alias: env.id for env in BUILTIN_ENVS}


def builtin_env(name: str) -> BuiltinEnv | None:
    """The built-in environment with this short name or id, or None."""
    return next((env for env in BUILTIN_ENVS if name in (env.alias, env.id)), None)


def register_builtin_envs() -> None:
    """Register every built-in environment with Gymnasium (idempotent)."""
    for env in BUILTIN_ENVS:
        if env.id not in gym.registry:
            gym.register(id=env.id, entry_point=env.entry_point)


def resolve_env_id(name: str) -> str:
    """The Gymnasium id for a short alias or an id; unknown plain names fail with a hint."""
    if name.startswith("remote:"):  # an environment server: a RemoteEnv id (envs/remote.py)
        from areal_agents.envs.remote import register_remote

        return register_remote(name)
    if name in ALIASES:
        return ALIASES[name]
    if name in gym.registry or ":" in name:
        return name
    if "/" in name or "-v" in name:  # looks like an id: let gym.make report what it knows
        return name
    raise UnknownEnvironmentError(
        f"unknown environment {name!r}"
        + did_you_mean(name, [*ALIASES, *gym.registry])
        + f"; known short names: {sorted(ALIASES)}; or pass a registered Gymnasium id"
    )


def make_env(name: str, **kwargs: Any) -> gym.Env[Any, Any]:
    """``gym.make`` on a short alias or an id, with a clear error for unknown names."""
    register_builtin_envs()
    env_id = resolve_env_id(name)
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as e:
        if "not found" in str(e) or "doesn't exist" in str(e) or "No registered env" in str(e):
            raise UnknownEnvironmentError(
                f"environment {env_id!r} is not registered: {e}"
                + did_you_mean(env_id, list(gym.registry))
            ) from None
        raise
