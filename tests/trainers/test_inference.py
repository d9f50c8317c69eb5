"""The inference servers the trainer starts: their thread settings reach the server process."""

from __future__ import annotations

import itertools

import pytest

from areal_agents.errors import ConfigError
from areal_agents.trainers.config import InferenceConfig
from areal_agents.trainers.inference import (
    server_torch_threads,
    start_servers,
    stop_servers,
    thread_env,
)


def test_thread_env_and_validation() -> None:
    assert thread_env(InferenceConfig()) == {}
    assert thread_env(InferenceConfig(torch_threads=2)) == {
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
    }
    with pytest.raises(ConfigError, match=r"inference\.torch_threads=0"):
        InferenceConfig(torch_threads=0)
    with pytest.raises(ConfigError, match="VLLM_CPU_OMP_THREADS_BIND"):
        InferenceConfig(engine="vllm", torch_threads=1)


def test_choosing_vllm_on_the_recipe_keeps_it() -> None:
    """The recipe sets inference.torch_threads=1 for the built-in server: switching the engine
    leaves it unset (vLLM binds its own threads) and keeps the rest; a value the user gives for
    it is refused, naming why (tests/test_hydra_cli.py compares --cfg job before and after)."""
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig

    for argv in (["inference.engine=vllm"], ["inference=vllm"]):
        cfg = load_config(TrainConfig, argv)
        assert cfg.inference.engine == "vllm" and cfg.inference.torch_threads is None
        assert cfg.inference.max_tokens == TrainConfig().inference.max_tokens
    with pytest.raises(ConfigError, match="VLLM_CPU_OMP_THREADS_BIND"):
        load_config(TrainConfig, ["inference.engine=vllm", "inference.torch_threads=1"])


@pytest.mark.integration
def test_a_started_server_runs_with_the_configured_torch_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from areal_agents.trainers.modeling import tiny_model_path

    # torch caps OMP_NUM_THREADS at the cores it sees: 1 differs from the inherited 2 on any
    # host with two cores or more
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    cfg = InferenceConfig(torch_threads=1, startup_timeout_s=300)
    servers = start_servers(cfg, tiny_model_path(), "policy")  # local: no placement
    try:
        assert server_torch_threads(servers) == [1]
    finally:
        stop_servers(servers)
    assert server_torch_threads(servers) == [None]  # stopped: nothing answers


@pytest.mark.parametrize("engine", ["builtin", "vllm"])
def test_the_servers_a_run_starts_report_the_sampling_distributions_logprobs(engine: str) -> None:
    """Behaviour log-probs must be those of the distribution the token was drawn from (the
    learner computes its own at ``inference.temperature``): every server a run starts gets
    ``--logprobs-mode processed_logprobs``, unless its ``extra_args`` choose a mode."""
    from areal_agents.trainers.inference import _create

    def flags(extra: tuple[str, ...] = ()) -> list[str]:
        cfg = InferenceConfig(engine=engine, extra_args=extra, torch_threads=None)
        args = list(_create(cfg, "model-dir", "policy", "127.0.0.1", None).extra_args)
        return [v for k, v in itertools.pairwise(args) if k == "--logprobs-mode"]

    assert flags() == ["processed_logprobs"]
    assert flags(("--logprobs-mode", "raw_logprobs")) == ["raw_logprobs"]  # the user's choice
