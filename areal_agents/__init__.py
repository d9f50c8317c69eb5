"""areal_agents: asynchronous reinforcement learning for LLM agents.

Importing the package registers its environments with Gymnasium under ``areal_agents/``.
"""

from areal_agents.envs.registry import make_env, register_builtin_envs, resolve_env_id
from areal_agents.errors import AgentsError, ConfigError, InfrastructureError
from areal_agents.types import Message, ToolCall, ToolSpec, Trajectory, Turn

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

register_builtin_envs()
