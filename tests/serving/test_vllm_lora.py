"""How a LoRA run starts vLLM and which model its clients name (no vLLM process here; the real
server is exercised in test_lora_vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_agents.errors import ConfigError
from areal_agents.serving.vllm import VLLMServer
from areal_agents.serving.vllm_lora import (
    launch_args,
    lora_flags,
    max_lora_rank,
    write_zero_adapter,
)
from areal_agents.trainers.config import (
    EnvConfig,
    InferenceConfig,
    LoraConfig,
    ModelConfig,
    TrainConfig,
)
from areal_agents.trainers.lora import adapter_state, apply_lora, serving_setup
from areal_agents.trainers.modeling import load_policy, tiny_model_path


def test_max_lora_rank_is_the_smallest_rank_vllm_accepts() -> None:
    assert [max_lora_rank(r) for r in (1, 2, 8, 9, 16, 17, 300, 512)] == [
        1,
        8,
        8,
        16,
        16,
        32,
        320,
        512,
    ]
    with pytest.raises(ConfigError, match=r"model\.lora\.r=513"):
        max_lora_rank(513)


def test_the_zero_adapter_has_the_learners_names_and_shapes_and_is_zero(tmp_path: Path) -> None:
    """vLLM loads the zero adapter at start and each pushed one in place of it: the two must
    cover the same modules with the same shapes, and the zero one must leave the base as is."""
    from safetensors.torch import load_file

    lora = LoraConfig(r=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
    model = load_policy(tiny_model_path())
    apply_lora(model, lora)
    pushed = adapter_state(model)
    out = write_zero_adapter(
        tiny_model_path(), tmp_path / "zero", r=4, alpha=8.0, target_modules=lora.target_modules
    )
    zero = load_file(str(out / "adapter_model.safetensors"))
    assert {k: tuple(v.shape) for k, v in zero.items()} == {
        k: tuple(v.shape) for k, v in pushed.items()
    }
    assert all(not t.any() for t in zero.values())
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    assert config["target_modules"] == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="no 2-D weight"):
        write_zero_adapter(
            tiny_model_path(), tmp_path / "x", r=4, alpha=8.0, target_modules=["nope"]
        )


def test_serving_setup_adds_vllms_lora_flags_and_names_the_adapter(tmp_path: Path) -> None:
    lora = LoraConfig(r=12, alpha=24.0)
    env = EnvConfig.from_name("calculator")
    builtin = TrainConfig(env=env, model=ModelConfig(name="tiny", lora=lora))
    assert serving_setup(builtin, tiny_model_path(), tmp_path) == (builtin.inference, "policy")
    no_lora = TrainConfig(env=env, inference=InferenceConfig(engine="vllm"))
    assert serving_setup(no_lora, tiny_model_path(), tmp_path) == (no_lora.inference, "policy")
    assert not (tmp_path / "lora-base").exists()

    cfg = TrainConfig(
        env=env,
        model=ModelConfig(name="tiny", lora=lora),
        inference=InferenceConfig(engine="vllm", extra_args=("--seed", "3")),
    )
    serving, name = serving_setup(cfg, tiny_model_path(), tmp_path)
    assert name == "policy-lora"
    zero = (tmp_path / "lora-base").resolve()
    assert serving.extra_args == ("--seed", "3", *lora_flags("policy-lora", 12, zero))
    assert "--max-lora-rank 16" in " ".join(serving.extra_args)  # 12 is no vLLM rank
    assert json.loads((zero / "adapter_config.json").read_text())["r"] == 12
    assert serving.engine == "vllm" and cfg.inference.extra_args == ("--seed", "3")


def test_the_launcher_allows_run_time_adapter_loading_only_with_lora(tmp_path: Path) -> None:
    flags, name = launch_args(
        tiny_model_path(), tmp_path, "policy", r=8, alpha=16.0, target_modules=["q_proj"]
    )
    with_lora = VLLMServer(str(tiny_model_path()), served_model_name="policy", extra_args=flags)
    plain = VLLMServer(str(tiny_model_path()), served_model_name="policy")
    assert with_lora.adapter_name == name == "policy-lora"
    assert with_lora.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.environment()
    command = with_lora.command()
    assert command[command.index("--lora-modules") + 1] == f"policy-lora={tmp_path.resolve()}"
    assert command[command.index("--served-model-name") + 1] == "policy"  # the base, unchanged
