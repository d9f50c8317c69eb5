"""The inference engines a trainer can start, by name: ``inference.engine=builtin|vllm``.

Each :class:`EngineSpec` names its launcher class by import path (imported on use, as
Gymnasium entry points are, so that reading the registry loads neither torch nor vLLM) and says
what differs between engines, so that callers ask the engine instead of branching on its name.
A launcher class is built as ``cls(model_dir, served_model_name=..., host=..., extra_args=...,
log_path=...)``, has ``start()``, ``wait_ready(timeout)`` and an ``extra_env`` dict for its
child process, and implements :class:`~areal_agents.serving.base.InferenceServer`.

>>> get_engine("vllm").server
'areal_agents.serving.vllm:VLLMServer'
>>> get_engine("builtin").version_source("http://127.0.0.1:1/v1") is None
True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from areal_agents.errors import ConfigError, did_you_mean

__all__ = ["ENGINES", "EngineSpec", "get_engine", "register_engine"]


@dataclass(frozen=True)
class EngineSpec:
    """One inference engine."""

    name: str
    """``inference.engine=NAME``."""
    server: str
    """``module:Class`` of the launcher (see the module docstring)."""
    torch_threads_note: str | None = None
    """None when ``inference.torch_threads`` (OMP/MKL threads of the server process) applies;
    otherwise why it does not and what to set instead."""
    version_probe: str | None = None
    """``module:function`` that, given a server's base URL, returns a function reading the
    served weight version; for engines whose responses carry no ``weight_version``."""

    def server_class(self) -> Any:
        """The launcher class."""
        return _load(self.server)

    def version_source(self, base_url: str) -> Callable[[], int] | None:
        """Where a token client reads the weight version (None: from each response)."""
        return None if self.version_probe is None else _load(self.version_probe)(base_url)


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


#: name -> engine; :func:`register_engine` adds one.
ENGINES: dict[str, EngineSpec] = {}


def register_engine(spec: EngineSpec) -> EngineSpec:
    """Make ``spec`` selectable as ``inference.engine=NAME``."""
    if spec.name in ENGINES and ENGINES[spec.name] != spec:
        raise ConfigError(f"inference engine {spec.name!r} is already registered")
    ENGINES[spec.name] = spec
    return spec


def get_engine(name: str) -> EngineSpec:
    """The engine registered as ``name``; unknown names fail with a suggestion."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(
            f"inference.engine={name!r} is not a known engine"
            + did_you_mean(name, ENGINES)
            + f"; choose one of {sorted(ENGINES)}"
        ) from None


register_engine(EngineSpec("builtin", "areal_agents.serving.server:BuiltinServer"))
register_engine(
    EngineSpec(
        "vllm",
        "areal_agents.serving.vllm:VLLMServer",
        torch_threads_note="vLLM on CPU takes its threads from VLLM_CPU_OMP_THREADS_BIND",
    )
)
