"""FSDP2 plumbing: process groups, sharding, and full (rank-count independent) state dicts.

Checkpoints hold *full* state dicts gathered on rank 0, so a run saved with 2 learner ranks
can resume with 1 and the other way round. Loading broadcasts from rank 0.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

__all__ = [
    "full_model_state",
    "full_optimizer_state",
    "init_distributed",
    "load_full_state",
    "reshard",
    "shard_model",
]


def init_distributed(
    rank: int, world_size: int, master_addr: str, master_port: int, *, use_gpu: bool
) -> torch.device:
    """Join the learners' process group (NCCL on GPU, gloo on CPU); returns this rank's device."""
    if master_addr in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep gloo on loopback
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    if use_gpu and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(minutes=10),
        )
    return device


def shard_model(model: nn.Module, layers: list[nn.Module]) -> nn.Module:
    """``fully_shard`` every transformer block, then the root (FSDP2's recommended layout)."""
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def reshard(model: nn.Module) -> None:
    """Free the unsharded parameters a no-grad forward left behind. FSDP2 keeps the root
    module unsharded after its forward, for the backward that usually follows; after a
    measurement no backward follows, and the root's parameters (the embeddings, the final
    norm) would stay gathered, as plain tensors without their gradients, until the next
    forward. Local: no communication. A model that is not sharded is left as it is."""
    free = getattr(model, "reshard", None)
    if callable(free):
        free()


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module, *, trainable_only: bool = False) -> dict[str, Any]:
    """The whole model's parameters on rank 0 (CPU tensors); ``{}`` on other ranks.
    ``trainable_only``: only parameters that require gradients (LoRA adapters)."""
    if not trainable_only:
        return get_model_state_dict(model, options=_FULL)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    state = get_model_state_dict(model, options=options)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in trainable}  # a tied head is not trainable


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole optimizer state on rank 0, keyed by parameter names; ``{}`` elsewhere."""
    return dict(get_optimizer_state_dict(model, optimizer, options=_FULL))


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any] | None,
    *,
    trainable_only: bool = False,
) -> None:
    """Load full state dicts held by rank 0 (other ranks pass ``{}``) into a sharded model.
    ``trainable_only``: ``model_state`` holds only the trainable parameters (the rest stay)."""
    options = StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, strict=not trainable_only
    )
    set_model_state_dict(model, model_state, options=options)
    if optimizer is not None and optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
