"""LoRA on the learner: adapters on chosen linear layers, the only weights that train.

:func:`apply_lora` replaces every ``nn.Linear`` whose last name component is in
``model.lora.target_modules`` by a :class:`LoraLinear` (``base_layer`` frozen, ``lora_A``
random, ``lora_B`` zero, so the model starts as the base) and freezes every other parameter.
The optimizer then holds only the adapters, checkpoints hold only them (the base is the model
directory), and the weight push sends only them (:mod:`areal_agents.serving.adapters`, PEFT's
tensor names). The reference policy of the KL term is the same model with the adapters off
(:func:`adapters_disabled`), not a second copy.

The module mirrors PEFT's LoRA layout and file format (``base_layer``, ``lora_A``, ``lora_B``,
``alpha / r``), so an adapter saved here loads in PEFT and in vLLM.

>>> from torch import nn
>>> from areal_agents.trainers.config import LoraConfig
>>> net = nn.Sequential()
>>> net.add_module("q_proj", nn.Linear(4, 4))
>>> net.add_module("up", nn.Linear(4, 4))
>>> apply_lora(net, LoraConfig(r=2, target_modules=("q_proj",)))
['q_proj']
>>> sorted(n for n, p in net.named_parameters() if p.requires_grad)
['q_proj.lora_A.weight', 'q_proj.lora_B.weight']
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from torch import Tensor, nn

from areal_agents.errors import ConfigError
from areal_agents.serving.adapters import PEFT_PREFIX
from areal_agents.trainers.config import LoraConfig

__all__ = [
    "LoraLinear",
    "adapter_state",
    "adapters_disabled",
    "apply_lora",
    "merged_state",
]


class LoraLinear(nn.Module):
    """``base_layer(x) + dropout(x) @ A.T @ B.T * scaling`` (PEFT's ``lora.Linear``)."""

    def __init__(self, base_layer: nn.Linear, r: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.base_layer = base_layer
        dtype, device = base_layer.weight.dtype, base_layer.weight.device
        self.lora_A = nn.Linear(base_layer.in_features, r, bias=False, dtype=dtype, device=device)
        self.lora_B = nn.Linear(r, base_layer.out_features, bias=False, dtype=dtype, device=device)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # PEFT's default
        nn.init.zeros_(self.lora_B.weight)  # the adapted model starts as the base
        self.scaling = alpha / r
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.disabled = False
        """True inside :func:`adapters_disabled`: the layer is its base."""

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.base_layer(x)
        if self.disabled:
            return out
        return out + self.lora_B(self.lora_A(self.dropout(x))) * self.scaling


def apply_lora(model: nn.Module, cfg: LoraConfig) -> list[str]:
    """Put a :class:`LoraLinear` on every targeted linear layer of ``model`` and freeze all
    other parameters; returns the adapted module names (a :class:`ConfigError` naming
    ``model.lora.target_modules`` when nothing matches)."""
    targets = set(cfg.target_modules)
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets
    ]
    if not found:
        kinds = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        )
        raise ConfigError(
            f"model.lora.target_modules={list(cfg.target_modules)}: no linear layer of the model "
            f"has such a name; its linear layers are {kinds}"
        )
    model.requires_grad_(False)
    for name, linear in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoraLinear(linear, cfg.r, cfg.alpha, cfg.dropout))
    return [name for name, _ in found]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base inside the block (the KL reference; PEFT's
    ``disable_adapter()``)."""
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    for layer in layers:
        layer.disabled = True
    try:
        yield
    finally:
        for layer in layers:
            layer.disabled = False


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapter tensors, whole (FSDP shards gathered: collective, every rank must call),
    on CPU, under PEFT's saved names (``base_model.model.<module>.lora_A.weight``)."""
    out: dict[str, Tensor] = {}
    for name, param in model.named_parameters():
        if ".lora_A." not in name and ".lora_B." not in name:
            continue
        full: Any = param.full_tensor() if hasattr(param, "full_tensor") else param
        out[PEFT_PREFIX + name] = full.detach().to("cpu").clone()
    return out


def merged_state(state: Mapping[str, Tensor], scaling: float) -> dict[str, Tensor]:
    """A full state dict of a LoRA model under the base model's Hugging Face names:
    ``<m>.base_layer.weight`` plus ``scaling * B @ A`` becomes ``<m>.weight`` (for exporting
    the policy as an ordinary checkpoint)."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        if ".base_layer." not in name:
            out[name] = tensor
            continue
        module, _, leaf = name.partition(".base_layer.")
        if leaf == "weight":
            a, b = state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"]
            delta = (b.float() @ a.float()) * scaling
            tensor = (tensor.float() + delta).to(tensor.dtype)
        out[f"{module}.{leaf}"] = tensor
    return out
