"""Helpers for moving weights into a server: safetensors bytes, and tensor shapes checked first.

The contract the servers implement is :class:`~areal_agents.serving.base.InferenceServer`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from areal_agents.errors import WeightSyncError
from areal_agents.serving.staging import safetensors_files

if TYPE_CHECKING:
    import torch

__all__ = [
    "check_shapes",
    "checkpoint_shapes",
    "state_dict_shapes",
    "state_dict_to_bytes",
]


def state_dict_to_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    """A state dict as safetensors bytes (contiguous CPU copies; shared storage is fine)."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()})


def state_dict_shapes(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape."""
    return {k: tuple(v.shape) for k, v in state.items()}


def checkpoint_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every ``*.safetensors`` file at ``path``, read from the headers."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in safetensors_files(path):
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(int(d) for d in meta["shape"])
    return shapes


def check_shapes(
    expected: Mapping[str, tuple[int, ...]], got: Mapping[str, tuple[int, ...]], *, where: str
) -> None:
    """Raise :class:`WeightSyncError` when ``got`` has a tensor ``expected`` lacks or reshapes.

    A checkpoint may omit tensors (a tied output head); it may not add or reshape any, because
    loading such a checkpoint kills a vLLM engine instead of failing the request.
    """
    problems = []
    for name, shape in got.items():
        if name not in expected:
            problems.append(f"unexpected tensor {name!r}")
        elif tuple(expected[name]) != tuple(shape):
            problems.append(f"{name}: shape {tuple(shape)} != served {tuple(expected[name])}")
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise WeightSyncError(
            f"{where} does not fit the served model: {'; '.join(problems[:3])}{more}"
        )
