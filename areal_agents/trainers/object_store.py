"""``inference.weight_sync=object_store``: weights through Ray's object store, no shared disk.

The learner's state dict stays where rank 0 returned it, in Ray's object store
(:meth:`LearnerGroup.state_ref`). On the server's node — the driver for a server it started,
the server's host actor on a cluster — the reference is resolved (Ray copies the bytes between
nodes itself), the tensors are written once to node-local shared memory (``/dev/shm``, a
tmpfs) as a safetensors file, and the server loads that file (its ``/update_weights_from_disk``
route: a memory-to-memory copy, no HTTP body). Nothing is written under the run directory, so
this works across nodes without a shared filesystem; it is what ``weight_sync=auto`` picks on
a cluster.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from areal_agents.errors import WeightSyncError

__all__ = ["push_ref", "shm_root", "stage_state"]


def shm_root() -> str:
    """Node-local shared memory (``/dev/shm``) when writable, else the temp directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def stage_state(state: Mapping[str, Any]) -> Path:
    """Write ``state`` as ``model.safetensors`` in a fresh directory under :func:`shm_root`.

    A tensor that shares storage with one written before (a tied output head) is left out: a
    server keeps a missing tensor tied, as it does when loading a checkpoint without it.
    """
    from safetensors.torch import save_file

    seen: set[tuple[int, int]] = set()
    tensors = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
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
    """Resolve ``refs[0]`` (a state dict in Ray's object store) here and load it into
    ``server`` (anything with ``update_weights_from_disk``) through shared memory."""
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
    directory = stage_state(state)
    del state
    try:
        server.update_weights_from_disk(str(directory), version=version, timeout=timeout)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
