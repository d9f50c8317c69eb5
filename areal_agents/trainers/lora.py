"""LoRA on the learner: adapters on chosen linear layers, the only weights that train.

PEFT does the layers: :func:`apply_lora` injects ``peft``'s LoRA into the model in place
(:func:`peft.inject_adapter_in_model`, adapter ``"default"``), so each targeted linear layer
becomes a ``peft`` ``lora.Linear`` (``base_layer`` frozen, ``lora_A`` random, ``lora_B`` zero:
the model starts as the base) and every other parameter is frozen. The model keeps its class
and its Hugging Face names; adapter parameters are ``<module>.lora_A.default.weight``.
The optimizer then holds only the adapters, checkpoints hold only them (the base is the model
directory), and the weight push sends only them under PEFT's saved names
(:func:`adapter_state`, :mod:`areal_agents.serving.adapters`). The reference policy of the KL
term is the same model with the adapters off (:func:`adapters_disabled`), not a second copy.

>>> from torch import nn
>>> from areal_agents.trainers.config import InferenceConfig, LoraConfig, TrainConfig
>>> net = nn.Sequential()
>>> net.add_module("q_proj", nn.Linear(4, 4))
>>> net.add_module("up", nn.Linear(4, 4))
>>> apply_lora(net, LoraConfig(r=2, target_modules=("q_proj",)))
['q_proj']
>>> sorted(n for n, p in net.named_parameters() if p.requires_grad)
['q_proj.lora_A.default.weight', 'q_proj.lora_B.default.weight']
>>> sorted(adapter_state(net))
['base_model.model.q_proj.lora_A.weight', 'base_model.model.q_proj.lora_B.weight']
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import peft
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn

from areal_agents.errors import ConfigError
from areal_agents.serving.adapters import PEFT_PREFIX
from areal_agents.trainers.config import InferenceConfig, LoraConfig, TrainConfig

__all__ = [
    "ADAPTER",
    "LoraLayer",
    "adapter_state",
    "adapters_disabled",
    "apply_lora",
    "merged_state",
    "serving_setup",
]

ADAPTER = "default"
"""The name of the one adapter (PEFT's default; it appears in parameter names, not in the
saved adapter)."""


def apply_lora(model: nn.Module, cfg: LoraConfig) -> list[str]:
    """Inject PEFT's LoRA on every targeted linear layer of ``model`` (in place) and freeze all
    other parameters; returns the adapted module names (a :class:`ConfigError` naming
    ``model.lora.target_modules`` when nothing matches)."""
    targets = set(cfg.target_modules)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    found = [name for name, _ in linears if name.rsplit(".", 1)[-1] in targets]
    if not found:
        kinds = sorted({n.rsplit(".", 1)[-1] for n, _ in linears})
        raise ConfigError(
            f"model.lora.target_modules={list(cfg.target_modules)}: no linear layer of the model "
            f"has such a name; its linear layers are {kinds}"
        )
    config = peft.LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # typed int; a float works (alpha / r)
        lora_dropout=cfg.dropout,
        target_modules=found,  # full names: only the linear layers, as the config says
        bias="none",
    )
    peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER)  # freezes the base
    return [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base inside the block (the KL reference; PEFT's
    ``disable_adapter()``: each layer's ``enable_adapters``; enabling them again makes the
    adapters trainable again)."""
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapter tensors, whole (FSDP shards gathered: collective, every rank must call),
    on CPU, under PEFT's saved names (``base_model.model.<module>.lora_A.weight``, what
    :func:`peft.get_peft_model_state_dict` gives and ``save_pretrained`` writes)."""
    full: dict[str, Tensor] = {}
    for name, param in model.named_parameters():
        if ".lora_A." not in name and ".lora_B." not in name:
            continue
        whole: Any = param.full_tensor() if hasattr(param, "full_tensor") else param
        full[name] = whole.detach().to("cpu").clone()
    # save_embedding_layers=False: no embedding is adapted, and "auto" would read the base
    # model's config (from disk or a hub) on every push to find out
    state = peft.get_peft_model_state_dict(
        model, state_dict=full, adapter_name=ADAPTER, save_embedding_layers=False
    )
    return {PEFT_PREFIX + k: v for k, v in state.items()}


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
            a = state[f"{module}.lora_A.{ADAPTER}.weight"]
            b = state[f"{module}.lora_B.{ADAPTER}.weight"]
            delta = (b.float() @ a.float()) * scaling
            tensor = (tensor.float() + delta).to(tensor.dtype)
        out[f"{module}.{leaf}"] = tensor
    return out


def serving_setup(
    cfg: TrainConfig, model_dir: Path, run_dir: Path, served_name: str = "policy"
) -> tuple[InferenceConfig, str]:
    """How the inference servers start and which ``model`` the clients send: ``cfg.inference``
    and ``served_name``, except with LoRA on vLLM, where the servers get vLLM's LoRA flags and
    an all-zero starting adapter (written to ``<run>/lora-base``) and the clients name the
    adapter (:mod:`areal_agents.serving.vllm_lora`). The built-in server merges each adapter
    into the weights it serves under ``served_name``."""
    lora = cfg.model.lora
    if not lora.enabled or cfg.inference.engine != "vllm":
        return cfg.inference, served_name
    from areal_agents.serving.vllm_lora import launch_args

    flags, name = launch_args(
        model_dir,
        run_dir / "lora-base",
        served_name,
        r=lora.r,
        alpha=lora.alpha,
        target_modules=lora.target_modules,
    )
    extra = (*cfg.inference.extra_args, *flags)
    return dataclasses.replace(cfg.inference, extra_args=extra), name
