"""Gymnasium environments for multi-turn tool use, and their registration.

The built-in environments are registered with Gymnasium when ``areal_agents`` is imported
(``import areal_agents; gym.make("areal_agents/Calculator-v0")``), as ``ale_py`` and
``minigrid`` do: their entry points are strings, so registering imports no environment.
The names below (``CalculatorEnv``, ``MultiTurnEnv``, ...) are imported on first use, so that
importing this package (and so ``areal_agents``) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from areal_agents.envs.registry import (
    ALIASES,
    BUILTIN_ENVS,
    BuiltinEnv,
    builtin_env,
    make_env,
    register_builtin_envs,
    resolve_env_id,
)

if TYPE_CHECKING:
    from areal_agents.envs.base import ERROR_KINDS, MultiTurnEnv, Score, Task
    from areal_agents.envs.calculator import CalculatorEnv
    from areal_agents.envs.code_sandbox import CodeSandboxEnv
    from areal_agents.envs.math_python import MathPythonEnv
    from areal_agents.envs.search import SearchEnv
    from areal_agents.envs.spaces import MessagesSpace, TurnSpace

__all__ = [
    "ALIASES",
    "BUILTIN_ENVS",
    "ERROR_KINDS",
    "BuiltinEnv",
    "CalculatorEnv",
    "CodeSandboxEnv",
    "MathPythonEnv",
    "MessagesSpace",
    "MultiTurnEnv",
    "Score",
    "SearchEnv",
    "Task",
    "TurnSpace",
    "builtin_env",
    "make_env",
    "register_builtin_envs",
    "resolve_env_id",
]

#: name -> the module that defines it, imported on first use.
_LAZY = {
    "ERROR_KINDS": "base",
    "MultiTurnEnv": "base",
    "Score": "base",
    "Task": "base",
    "CalculatorEnv": "calculator",
    "CodeSandboxEnv": "code_sandbox",
    "MathPythonEnv": "math_python",
    "SearchEnv": "search",
    "MessagesSpace": "spaces",
    "TurnSpace": "spaces",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'areal_agents.envs' has no attribute {name!r}")
    return getattr(importlib.import_module(f"areal_agents.envs.{module}"), name)


register_builtin_envs()
