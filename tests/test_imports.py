"""Importing the contracts stays light; the built-in environments register where envs are made."""

from __future__ import annotations

import subprocess
import sys

from areal_agents.config import load_config
from areal_agents.envs.registry import ALIASES, BUILTIN_ENVS, builtin_env
from areal_agents.trainers.config import EnvConfig, TrainConfig


def python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_contracts_import_neither_gymnasium_nor_environments() -> None:
    out = python(
        "import sys, areal_agents, areal_agents.types, areal_agents.errors, areal_agents.config\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gymnasium', 'torch')))\n"
        "print(sorted(m for m in sys.modules if m.startswith('areal_agents.envs')))"
    )
    assert out.splitlines() == ["[]", "[]"]


def test_builtin_ids_register_where_environments_are_made() -> None:
    out = python(
        "import gymnasium as gym, areal_agents\n"
        "print('areal_agents/Calculator-v0' in gym.registry)\n"
        "env = gym.make('areal_agents.envs:areal_agents/Calculator-v0')\n"  # Gymnasium's module:id
        "print(type(env.unwrapped).__name__, 'areal_agents/Search-v0' in gym.registry)"
    )
    assert out.splitlines() == ["False", "CalculatorEnv True"]
    out = python(
        "import gymnasium as gym, areal_agents\n"
        "areal_agents.make_env('calculator').close()\n"  # the lazy package attribute
        "print(gym.make('areal_agents/MathPython-v0').spec.id)"
    )
    assert out == "areal_agents/MathPython-v0"


def test_one_list_of_builtin_environments_feeds_aliases_and_trainer_presets() -> None:
    assert sorted(ALIASES) == ["calculator", "code_sandbox", "math_python", "search"]
    for env in BUILTIN_ENVS:
        assert ALIASES[env.alias] == env.id
        assert builtin_env(env.alias) is builtin_env(env.id) is env
        assert EnvConfig.from_name(env.alias).max_turns == env.train_max_turns
        assert load_config(TrainConfig, [f"env={env.alias}"]).env.max_turns == env.train_max_turns
    assert EnvConfig.from_name("acme/MyTask-v0").max_turns is None  # a user id keeps its own
