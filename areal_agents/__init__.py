"""areal_agents: asynchronous reinforcement learning for LLM agents.

Importing the package registers the built-in environments with Gymnasium, as ``ale_py`` and
``minigrid`` do::

    import gymnasium as gym
    import areal_agents

    env = gym.make("areal_agents/CodeSandbox-v0")

Registering loads Gymnasium (and NumPy) and the list of built-in environments
(``areal_agents.envs.registry``), not the environments themselves: their entry points are
strings, imported by ``gym.make``. Nothing heavy is imported (no torch, Ray, vLLM or
transformers; ``tests/test_imports.py`` pins the list), and the rest of the package is loaded on
use: :func:`make_env`, :func:`register_builtin_envs` and :func:`resolve_env_id` are attributes
of the package; the command lines, trainers and servers are modules to import.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from typing import TYPE_CHECKING, Any

#: When this process started running the package (``time.time()``, before the package's
#: imports): the zero of the trainer's start-up clock (:class:`~areal_agents.trainers.stop.
#: StartupClock`), whatever ran in the process before Python did (``exec`` from a script).
IMPORTED_AT = time.time()

from areal_agents.errors import AgentsError, ConfigError, InfrastructureError  # noqa: E402
from areal_agents.types import Message, ToolCall, ToolSpec, Trajectory, Turn  # noqa: E402

if TYPE_CHECKING:
    from areal_agents.envs.registry import make_env, register_builtin_envs, resolve_env_id

__version__ = "0.1.0"

__all__ = [
    "IMPORTED_AT",
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


# The list of built-in environments (no environment module: entry points are strings). A
# process without Gymnasium registers nothing: vLLM's own environment imports only the serving
# modules (``serving/vllm_transfer.py`` beside vLLM), and so does a server-only install.
if importlib.util.find_spec("gymnasium") is not None:
    from areal_agents.envs.registry import register_builtin_envs as _register_builtin_envs

    _register_builtin_envs()


def __getattr__(name: str) -> Any:
    # the registry's helpers (already loaded, with Gymnasium), by the package's name
    if name in _LAZY:
        return getattr(importlib.import_module("areal_agents.envs.registry"), name)
    raise AttributeError(f"module 'areal_agents' has no attribute {name!r}")
