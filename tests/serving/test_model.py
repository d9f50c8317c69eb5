"""The offline default model and model resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_agents.errors import ConfigError
from areal_agents.policies.templates import tool_chat_template
from areal_agents.serving.model import (
    DEFAULT_MODEL_NAME,
    default_model_path,
    find_default_gguf,
    resolve_model,
)


def test_default_model_is_a_converted_safetensors_copy(model_dir: Path) -> None:
    assert find_default_gguf().suffix == ".gguf"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == 576
    assert "quantization_config" not in config
    assert (model_dir / "model.safetensors").stat().st_size > 100_000_000
    # The project's tool template ships with the copy, so every engine renders tools alike.
    assert (model_dir / "chat_template.jinja").read_text() == tool_chat_template()
    assert default_model_path() == model_dir  # cached: same directory, no reconversion


def test_resolve_model(model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model("default") == str(model_dir)
    assert resolve_model(DEFAULT_MODEL_NAME) == str(model_dir)
    assert resolve_model(str(model_dir)) == str(model_dir.resolve())
    assert resolve_model("acme/some-hub-model") == "acme/some-hub-model"
    with pytest.raises(ConfigError, match=r"no config\.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(ConfigError, match="no such model directory"):
        resolve_model(str(tmp_path / "missing"))


def test_the_model_generates_text(tokenizer, hf_model) -> None:  # type: ignore[no-untyped-def]
    import torch

    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = hf_model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])
