"""``inference.weight_sync=object_store``: weights through Ray's object store, no shared disk.

The learner's state dict stays where rank 0 returned it, in Ray's object store
(:meth:`LearnerGroup.state_ref`), as numpy arrays (:func:`to_arrays`): Ray hands numpy arrays
out of its store without a copy, while torch tensors are unpickled into fresh memory (0.4 s for
the 513 MB default model, against 0.002 s). On the server's node — the driver for the servers it
started, the server's host actor on a cluster — a :class:`ShmLoader` resolves the reference (Ray
copies the bytes between nodes itself), copies the arrays once into the safetensors file it
keeps in node-local shared memory (:class:`~areal_agents.serving.staging.StagingFile`,
rewritten in place at every push), and has each server on that node load that file through its
``update_weights_from_disk`` (the built-in server maps it and copies each tensor once into its
parameter; vLLM reloads from the path). Nothing is written under the run directory, so this
works across nodes without a shared filesystem, for every engine; it is what
``weight_sync=auto`` picks on a cluster.

Copies of the weights per push: the learner's return into the object store, the object store
into the staged file, the file into the server's parameters (three ``memcpy``; the file stays
allocated and mapped across pushes, so no page is allocated or faulted in again).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from typing import Any

from areal_agents.errors import WeightSyncError
from areal_agents.serving.staging import StagingFile

__all__ = ["ShmLoader", "from_arrays", "to_arrays"]


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


class ShmLoader:
    """Loads state dicts from Ray's object store into the servers of this node, through one
    staged file kept across pushes (see the module docstring). Call :meth:`close` when done."""

    def __init__(self, root: str | None = None) -> None:
        self.staging = StagingFile(root)
        self.last_seconds: dict[str, float] = {}
        """The last :meth:`load`'s stages: ``get_s`` (resolve the reference), ``write_s`` (stage
        the file), ``load_s`` (the servers' loads, side by side)."""

    def load(self, servers: Sequence[Any], refs: list[Any], version: int, timeout: float) -> None:
        """Resolve ``refs[0]`` (a state dict in Ray's object store, as :func:`to_arrays` made it)
        here, stage it, and load it into every one of ``servers`` (anything with
        ``update_weights_from_disk(path, version, timeout)``) as ``version``."""
        import ray

        start = time.perf_counter()
        try:
            state = ray.get(refs[0], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WeightSyncError(
                f"weight version {version}: the state dict did not arrive from Ray's object "
                f"store within {timeout}s (inference.weight_sync_timeout_s)"
            ) from None
        if not state:
            raise WeightSyncError(f"weight version {version}: the learner returned no weights")
        got = time.perf_counter()
        directory = str(self.staging.write(from_arrays(state)))
        del state  # the object store may free its copy once the last reference goes
        written = time.perf_counter()
        if len(servers) == 1:
            servers[0].update_weights_from_disk(directory, version=version, timeout=timeout)
        else:
            with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
                loads = [
                    pool.submit(
                        s.update_weights_from_disk, directory, version=version, timeout=timeout
                    )
                    for s in servers
                ]
                for f in loads:
                    f.result()
        done = time.perf_counter()
        self.last_seconds = {
            "get_s": got - start,
            "write_s": written - got,
            "load_s": done - written,
        }

    def close(self) -> None:
        """Remove the staged file (idempotent)."""
        self.staging.close()
