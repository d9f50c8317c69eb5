"""Gymnasium environments for multi-turn tool use, and their registration.

Importing this package registers the built-in environments with Gymnasium
(``gym.make("areal_agents/Calculator-v0")`` works from then on); importing
``areal_agents`` or its contracts (``areal_agents.types``) does not.
"""

from areal_agents.envs.base import ERROR_KINDS, MultiTurnEnv, Score, Task
from areal_agents.envs.calculator import CalculatorEnv
from areal_agents.envs.code_sandbox import CodeSandboxEnv
from areal_agents.envs.math_python import MathPythonEnv
from areal_agents.envs.registry import (
    ALIASES,
    BUILTIN_ENVS,
    BuiltinEnv,
    builtin_env,
    make_env,
    register_builtin_envs,
    resolve_env_id,
)
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

register_builtin_envs()
