"""areal_agents: asynchronous reinforcement learning for LLM agents.

Importing the package (or its contracts, ``areal_agents.types`` and ``areal_agents.errors``)
is cheap and has no side effects: it loads neither Gymnasium nor any environment. The built-in
environments are registered with Gymnasium where environments are made: by
``import areal_agents.envs``, by :func:`make_env` (also reachable as ``areal_agents.make_env``)
and by the command lines. ``gym.make("areal_agents.envs:areal_agents/Calculator-v0")`` imports
and registers them through Gymnasium's ``module:id`` form.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from areal_agents.errors import AgentsError, ConfigError, InfrastructureError
from areal_agents.types import Message, ToolCall, ToolSpec, Trajectory, Turn

if TYPE_CHECKING:
    from areal_agents.envs.registry import make_env, register_builtin_envs, resolve_env_id

__version__ = "0.1.0"

__all__ = [
    "AgentsError",
    "ConfigError",
    "InfrastructureError",
    "Message",
    "ToolCall",
    "ToolSpec",
    "Trajectory",
    "Turn",
    "__version__",
    "make_env",
    "register_builtin_envs",
    "resolve_env_id",
]

_LAZY = {"make_env", "register_builtin_envs", "resolve_env_id"}


def __getattr__(name: str) -> Any:
    # Environment helpers load Gymnasium and the environments (which registers them): on use.
    if name in _LAZY:
        return getattr(importlib.import_module("areal_agents.envs.registry"), name)
    raise AttributeError(f"module 'areal_agents' has no attribute {name!r}")
