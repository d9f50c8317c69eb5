"""Registration of the built-in environments and the short names the command lines accept.

Built-in environments are registered with :func:`gymnasium.register` under the namespace
``areal_agents/``; any environment a user registers with plain ``gym.register`` works wherever
a built-in one does, because every name ends up in ``gym.make``. ``resolve_env_id`` turns a
short alias (``code_sandbox``) into its id, and passes anything else through untouched
(including Gymnasium's ``module:Env-v0`` form, which imports the user's module first).

>>> resolve_env_id("calculator")
'areal_agents/Calculator-v0'
>>> resolve_env_id("acme/MyTask-v0")
'acme/MyTask-v0'
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from areal_agents.errors import UnknownEnvironmentError, did_you_mean

__all__ = ["ALIASES", "BUILTIN_ENVS", "make_env", "register_builtin_envs", "resolve_env_id"]

#: id -> entry point of every built-in environment.
BUILTIN_ENVS: dict[str, str] = {
    "areal_agents/Calculator-v0": "areal_agents.envs.calculator:CalculatorEnv",
    "areal_agents/CodeSandbox-v0": "areal_agents.envs.code_sandbox:CodeSandboxEnv",
    "areal_agents/MathPython-v0": "areal_agents.envs.math_python:MathPythonEnv",
    "areal_agents/Search-v0": "areal_agents.envs.search:SearchEnv",
}

#: short name -> id, as used on the command line (``env=calculator``).
ALIASES: dict[str, str] = {
    "calculator": "areal_agents/Calculator-v0",
    "code_sandbox": "areal_agents/CodeSandbox-v0",
    "math_python": "areal_agents/MathPython-v0",
    "search": "areal_agents/Search-v0",
}


def register_builtin_envs() -> None:
    """Register every built-in environment with Gymnasium (idempotent)."""
    for env_id, entry_point in BUILTIN_ENVS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)


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
