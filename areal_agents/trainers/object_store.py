"""``inference.weight_sync=object_store``: weights through Ray's object store, no shared disk.

The learner's state dict stays where rank 0 returned it, in Ray's object store
(:meth:`LearnerGroup.state_ref`), as numpy arrays (:func:`to_arrays`): Ray hands numpy arrays
out of its store without a copy, while torch tensors are unpickled into fresh memory (0.4 s for
the 513 MB default model, against 0.002 s). On the server's node — the driver for a server it
started, the server's host actor on a cluster — the reference is resolved (Ray copies the bytes
between nodes itself), the tensors are written once to node-local shared memory (``/dev/shm``, a
tmpfs) as a safetensors file, and the server loads that file (its ``/update_weights_from_disk``
route: a memory-to-memory copy, no HTTP body). Nothing is written under the run directory, so
this works across nodes without a shared filesystem; it is what ``weight_sync=auto`` picks on a
cluster.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from areal_agents.errors import WeightSyncError

__all__ = ["from_arrays", "push_ref", "shm_root", "stage_state", "to_arrays"]


def shm_root() -> str:
    """Node-local shared memory (``/dev/shm``) when writable, else the temp directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def _storage_key(tensor: Any) -> tuple[int, int]:
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset())


def to_arrays(state: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """``name -> (numpy array, torch dtype name)`` sharing memory with ``state`` where it can
    (bfloat16, which numpy lacks, travels as its int16 bits). A tensor sharing storage with an
    earlier one (a tied output head) is left out."""
    import torch

    seen: set[tuple[int, int]] = set()
    out: dict[str, tuple[Any, str]] = {}
    for name, tensor in state.items():
        key = _storage_key(tensor)
        if key in seen:
            continue
        seen.add(key)
        t = tensor.detach().to("cpu").contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        out[name] = (t.numpy(), dtype)
    return out


def from_arrays(arrays: Mapping[str, tuple[Any, str]]) -> dict[str, Any]:
    """The tensors of :func:`to_arrays`, sharing the arrays' memory (read-only: do not write)."""
    import warnings

    import torch

    out = {}
    with warnings.catch_warnings():  # arrays out of Ray's store are read-only; only read here
        warnings.simplefilter("ignore", UserWarning)
        for name, (array, dtype) in arrays.items():
            tensor = torch.from_numpy(array)
            out[name] = tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor
    return out


def stage_state(state: Mapping[str, Any]) -> Path:
    """Write ``state`` as ``model.safetensors`` in a fresh directory under :func:`shm_root`.

    A tensor that shares storage with one written before (a tied output head) is left out: a
    server keeps a missing tensor tied, as it does when loading a checkpoint without it.
    """
    from safetensors.torch import save_file

    seen: set[tuple[int, int]] = set()
    tensors = {}
    for name, tensor in state.items():
        key = _storage_key(tensor)
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = tensor.detach().to("cpu").contiguous()
    directory = Path(tempfile.mkdtemp(prefix="areal-weights-", dir=shm_root()))
    try:
        save_file(tensors, str(directory / "model.safetensors"))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def push_ref(server: Any, refs: list[Any], version: int, timeout: float) -> None:
    """Resolve ``refs[0]`` (a state dict in Ray's object store, as :func:`to_arrays` made it)
    here and load it into ``server`` (anything with ``update_weights_from_disk``) through
    shared memory."""
    import ray

    try:
        state = ray.get(refs[0], timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise WeightSyncError(
            f"weight version {version}: the state dict did not arrive from Ray's object store "
            f"within {timeout}s (inference.weight_sync_timeout_s)"
        ) from None
    if not state:
        raise WeightSyncError(f"weight version {version}: the learner returned no weights")
    directory = stage_state(from_arrays(state))
    del state
    try:
        server.update_weights_from_disk(str(directory), version=version, timeout=timeout)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
