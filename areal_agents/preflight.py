"""Checks the command lines run before anything starts (a server, Ray, an episode).

A configuration that loads can still fail the moment it is used: an environment id whose
namespace or module does not exist, keyword arguments its constructor refuses, an output
directory that cannot be written. These checks do that first use up front and turn its
exception into a :class:`~areal_agents.errors.ConfigError` that names the key, so that
``eval`` and ``train`` answer ``error: <key>...`` instead of a traceback (or a traceback after
minutes of start-up).

>>> check_env("calculator", {}, name_key="env", kwargs_key="env_kwargs")
'areal_agents/Calculator-v0'
>>> check_env("acme/Nope-v0", {}, name_key="env", kwargs_key="env_kwargs")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
areal_agents.errors.UnknownEnvironmentError: env='acme/Nope-v0': Namespace acme not found. ...
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from areal_agents.envs.registry import resolve_env_id
from areal_agents.errors import AgentsError, ConfigError, UnknownEnvironmentError, did_you_mean

__all__ = ["check_env"]


def check_env(name: str, kwargs: Mapping[str, Any], *, name_key: str, kwargs_key: str) -> str:
    """Build the environment ``name`` once with ``kwargs`` and close it; return its Gymnasium id.

    ``module:Env-v0`` imports ``module`` first (it registers the environment) and returns
    ``Env-v0``. Failures raise :class:`ConfigError` naming ``name_key`` (unknown id, missing
    module) or ``kwargs_key`` (arguments the constructor refused); the package's own errors
    (a sandbox backend that cannot run here, ...) pass through unchanged.
    """
    env_id = resolve_env_id(name)
    if ":" in env_id:  # Gymnasium's "module:Env-v0"
        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(
                f"{name_key}={name!r}: cannot import module {module!r} ({e}); "
                "install it or fix the name"
            ) from None
    try:
        gym.spec(env_id)
    except gym.error.Error as e:
        raise UnknownEnvironmentError(
            f"{name_key}={name!r}: {e}" + did_you_mean(env_id, list(gym.registry))
        ) from None
    try:
        env = gym.make(env_id, **kwargs)
    except AgentsError as e:
        if isinstance(e, ConfigError) and not str(e).startswith(kwargs_key):
            raise ConfigError(f"{kwargs_key}: {e}") from None
        raise
    except (TypeError, ValueError, gym.error.Error) as e:
        raise ConfigError(f"{kwargs_key}={dict(kwargs)!r}: {name!r} refused them: {e}") from None
    env.close()
    return env_id
