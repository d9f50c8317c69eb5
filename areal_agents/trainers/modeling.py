"""Models the learner trains: the policy, an optional value model, and a tiny test model.

``model=default`` is SmolLM2-135M-Instruct converted offline (``serving.model``). ``model=tiny``
is a *randomly initialised* model with the same architecture family (Llama), the same
tokenizer and chat template, but 2 layers of width 128 (~6.6 M parameters, mostly the
embedding): it produces gibberish and exists so that tests of the training machinery (resume,
FSDP equivalence, weight sync) run in seconds. It is saved once, with a fixed seed, next to the
converted default model, so that the inference server can load it like any HF directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from areal_agents.errors import ConfigError
from areal_agents.files import atomic_directory

__all__ = ["TINY_MODEL_NAME", "ValueModel", "load_policy", "resolve_model_dir", "tiny_model_path"]

TINY_MODEL_NAME = "tiny-random-smollm2"
_TINY_STAMP = "areal_tiny.json"
_TINY_SHAPE = {  # head_dim 64 as in SmolLM2: vLLM's CPU attention supports no smaller one
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
}


def tiny_model_path(seed: int = 0) -> Path:
    """A tiny random Llama with the default model's tokenizer, saved once (see module doc)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from areal_agents.serving.model import cache_root, default_model_path

    target = cache_root() / f"{TINY_MODEL_NAME}-h{_TINY_SHAPE['hidden_size']}-s{seed}"
    if (target / _TINY_STAMP).is_file():
        return target
    source = default_model_path()
    config = AutoConfig.from_pretrained(str(source))
    for key, value in _TINY_SHAPE.items():
        setattr(config, key, value)
    config.tie_word_embeddings = True
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with atomic_directory(target, is_complete=lambda p: (p / _TINY_STAMP).is_file()) as work:
        model.save_pretrained(str(work), safe_serialization=True)
        AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(work))
        (work / _TINY_STAMP).write_text(json.dumps({"seed": seed, **_TINY_SHAPE}))
    return target


def resolve_model_dir(name: str) -> Path:
    """The local directory of ``model.name`` (``default``, ``tiny`` or a path)."""
    if name == "tiny":
        return tiny_model_path()
    from areal_agents.serving.model import resolve_model

    resolved = resolve_model(name)
    path = Path(resolved)
    if not path.is_dir():
        raise ConfigError(
            f"model={name}: not a local model directory; use model=default, model=tiny or a path "
            "to a saved Hugging Face model (no model hub is reached at run time)"
        )
    return path


def load_policy(path: Path, dtype: str = "float32", gradient_checkpointing: bool = False) -> Any:
    """The causal LM at ``path`` in training mode (dropout off: logprobs must be reproducible)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    _no_dropout(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model.train()
    return model


class ValueModel(nn.Module):
    """A critic: the policy's backbone (a separate copy) with a scalar head on every token."""

    def __init__(self, path: Path, dtype: str = "float32") -> None:
        super().__init__()
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(str(path), dtype=getattr(torch, dtype))
        _no_dropout(self.backbone)
        hidden = int(self.backbone.config.hidden_size)
        self.head = nn.Linear(hidden, 1, dtype=getattr(torch, dtype))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Values ``[B, T]``: ``V(prefix up to and including token t)``."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask)
        return self.head(hidden.last_hidden_state).squeeze(-1).clone()  # [B, T], not a view

    @property
    def layers(self) -> list[nn.Module]:
        return list(getattr(self.backbone, "layers", []))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM (what FSDP shards one by one)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def _no_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for key in ("attention_dropout", "hidden_dropout", "dropout"):
        if config is not None and hasattr(config, key):
            setattr(config, key, 0.0)
