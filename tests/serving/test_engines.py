"""The engine registry: the trainer asks the engine instead of branching on its name."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_agents.errors import ConfigError
from areal_agents.serving.base import InferenceServer
from areal_agents.serving.engines import ENGINES, EngineSpec, get_engine, register_engine
from areal_agents.trainers.config import InferenceConfig
from areal_agents.trainers.weight_sync import WeightSync


def test_builtin_engines_resolve_to_launchers_that_are_inference_servers(
    model_dir: Path,
) -> None:
    for name in ("builtin", "vllm"):
        engine = get_engine(name)
        server = engine.server_class()(str(model_dir), served_model_name="policy")
        assert isinstance(server, InferenceServer)  # built, not started
        assert server.base_url.startswith("http://127.0.0.1:")
    assert get_engine("builtin").version_source("http://127.0.0.1:9/v1") is None
    # vLLM, too, sends the version with each response (the launcher's middleware)
    assert get_engine("vllm").version_source("http://127.0.0.1:9/v1") is None


def test_unknown_engines_and_engine_specific_keys_fail_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="did you mean 'vllm'"):
        get_engine("vlm")
    with pytest.raises(ConfigError, match=r"inference\.engine='vlm'"):
        InferenceConfig(engine="vlm")
    with pytest.raises(ConfigError, match="VLLM_CPU_OMP_THREADS_BIND"):
        InferenceConfig(engine="vllm", torch_threads=1)


def test_a_registered_engine_is_selectable_like_the_built_in_ones() -> None:
    spec = EngineSpec("test_engine", "areal_agents.serving.server:BuiltinServer")
    register_engine(spec)
    try:
        assert InferenceConfig.from_name("test_engine").engine == "test_engine"
        assert InferenceConfig(engine="test_engine", torch_threads=2).torch_threads == 2
        with pytest.raises(ConfigError, match="already registered"):
            register_engine(EngineSpec("test_engine", "x:Y"))
    finally:
        ENGINES.pop("test_engine")


def test_only_the_trainer_push_is_called_weight_sync() -> None:
    import areal_agents.serving.weights as weights

    assert not hasattr(weights, "WeightSync")
    assert WeightSync.__module__ == "areal_agents.trainers.weight_sync"
