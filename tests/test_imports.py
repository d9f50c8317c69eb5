"""``import areal_agents`` registers the built-in environments and stays light: what it loads is
pinned here."""

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


#: What ``import areal_agents`` may load besides the standard library: the package's contracts,
#: the list of built-in environments, and Gymnasium (with NumPy) to register them in.
PACKAGE_MODULES = {
    "areal_agents",
    "areal_agents.envs",
    "areal_agents.envs.registry",
    "areal_agents.errors",
    "areal_agents.types",
}
THIRD_PARTY = {"gymnasium", "numpy", "farama_notifications", "typing_extensions", "cython_runtime"}


def test_importing_the_package_loads_the_contracts_and_the_registry_only() -> None:
    out = python(
        "import sys\n"
        "before = set(sys.modules)\n"
        "import areal_agents, areal_agents.types, areal_agents.errors\n"
        "print(sorted(m for m in sys.modules if m.startswith('areal_agents')))\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before if not m.startswith('_')}\n"
        "print(sorted(new - set(sys.stdlib_module_names)))"
    )
    ours, others = (eval(line) for line in out.splitlines())  # two printed lists
    assert set(ours) == PACKAGE_MODULES  # no environment, no config, no command line
    assert set(others) <= THIRD_PARTY | {"areal_agents"}, others  # no torch, ray, vllm, hydra...
    assert "gymnasium" in others


def test_importing_the_package_takes_well_under_a_second() -> None:
    """The budget is 1 s on a 2-core machine; the import takes about 0.15 s of CPU (0.2-0.3 s
    of wall clock). Measured in CPU time, which a busy machine does not inflate; torch alone
    takes about 1 s of CPU to import, transformers more."""
    out = python(
        "import time\n"
        "start = time.process_time()\n"
        "import areal_agents\n"
        "print(time.process_time() - start)"
    )
    assert float(out) < 1.0, f"import areal_agents took {float(out):.2f} s of CPU"


def test_import_areal_agents_registers_the_builtin_ids() -> None:
    out = python(
        "import gymnasium as gym, areal_agents\n"
        "print(all(e.id in gym.registry for e in areal_agents.envs.BUILTIN_ENVS))\n"
        "print(gym.spec('areal_agents/CodeSandbox-v0').entry_point)\n"
        "env = gym.make('areal_agents/Calculator-v0')\n"
        "print(type(env.unwrapped).__name__)"
    )
    assert out.splitlines() == [
        "True",
        "areal_agents.envs.code_sandbox:CodeSandboxEnv",
        "CalculatorEnv",
    ]
    out = python(  # Gymnasium's module:id form, and the package's lazy helper
        "import gymnasium as gym\n"
        "env = gym.make('areal_agents.envs:areal_agents/Search-v0')\n"
        "import areal_agents\n"
        "areal_agents.make_env('calculator').close()\n"
        "print(type(env.unwrapped).__name__, gym.make('areal_agents/MathPython-v0').spec.id)"
    )
    assert out == "SearchEnv areal_agents/MathPython-v0"


def test_the_config_layer_loads_no_environment_and_no_torch() -> None:
    out = python(
        "import sys, areal_agents.config\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'vllm')))\n"
        "print(sorted(m for m in sys.modules if m.startswith('areal_agents.envs.')))"
    )
    assert out.splitlines() == ["[]", "['areal_agents.envs.registry']"]


def test_one_list_of_builtin_environments_feeds_aliases_and_trainer_presets() -> None:
    assert sorted(ALIASES) == ["calculator", "code_sandbox", "math_python", "search"]
    for env in BUILTIN_ENVS:
        assert ALIASES[env.alias] == env.id
        assert builtin_env(env.alias) is builtin_env(env.id) is env
        assert EnvConfig.from_name(env.alias).max_turns == env.train_max_turns
        assert load_config(TrainConfig, [f"env={env.alias}"]).env.max_turns == env.train_max_turns
    assert EnvConfig.from_name("acme/MyTask-v0").max_turns is None  # a user id keeps its own
