"""``inference.weight_sync=object_store``: a state dict in Ray's object store reaches a server
through node-local shared memory, tensor for tensor, and leaves no file behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.errors import ConfigError, WeightSyncError
from areal_agents.trainers.config import InferenceConfig
from areal_agents.trainers.inference import WeightSync
from areal_agents.trainers.object_store import from_arrays, shm_root, stage_state, to_arrays


class LoadingServer:
    """Loads what it is given from disk, as the built-in server's route does."""

    def __init__(self) -> None:
        self.version = 0
        self.loaded: dict[str, torch.Tensor] = {}
        self.paths: list[str] = []

    def update_weights_from_disk(self, path: str, version: int, timeout: float) -> None:
        from safetensors.torch import load_file

        self.paths.append(path)
        self.loaded = load_file(str(Path(path) / "model.safetensors"))
        self.version = version

    def weight_version(self) -> int:
        return self.version


class RefLearners:
    """Rank 0's state dict left in the object store, as ``LearnerGroup.state_ref`` does."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def state_ref(self) -> Any:
        import ray

        return ray.put(to_arrays(self.state))


def test_stage_state_leaves_out_a_tied_copy() -> None:
    embed = torch.arange(6.0).reshape(3, 2)
    directory = stage_state({"embed.weight": embed, "lm_head.weight": embed, "b": torch.ones(2)})
    try:
        from safetensors.torch import load_file

        loaded = load_file(str(directory / "model.safetensors"))
        assert sorted(loaded) == ["b", "embed.weight"]
        assert torch.equal(loaded["embed.weight"], embed)
        assert str(directory).startswith(shm_root())
    finally:
        import shutil

        shutil.rmtree(directory)


def test_arrays_round_trip_every_dtype_and_drop_a_tied_copy() -> None:
    embed = torch.randn(3, 2)
    state = {"embed": embed, "head": embed, "bf": torch.randn(4).to(torch.bfloat16)}
    arrays = to_arrays(state)
    assert sorted(arrays) == ["bf", "embed"]
    back = from_arrays(arrays)
    assert back["bf"].dtype == torch.bfloat16 and torch.equal(back["bf"], state["bf"])
    assert torch.equal(back["embed"], embed)


def test_a_push_through_the_object_store_reaches_every_server(tmp_path: Path) -> None:
    from areal_agents.trainers.config import RayConfig
    from areal_agents.trainers.runtime import start_ray, stop_ray

    state = {"w": torch.randn(4, 3), "b": torch.randn(3).to(torch.bfloat16)}
    servers = [LoadingServer(), LoadingServer()]
    start_ray(RayConfig(num_cpus=1, object_store_mb=80))
    try:
        sync = WeightSync(InferenceConfig(weight_sync="object_store"), servers, tmp_path)
        sync.push(RefLearners(state), 1)
        with pytest.raises(WeightSyncError, match="no weights"):  # rank 0 returned nothing
            sync.push(RefLearners({}), 2)
    finally:
        stop_ray()
    for server in servers:
        assert server.version == 1
        assert torch.equal(server.loaded["w"], state["w"])
        assert torch.equal(server.loaded["b"], state["b"])
        assert not os.path.exists(server.paths[0])  # the shared-memory copy is gone
    assert list(tmp_path.iterdir()) == []  # nothing under the run directory


def test_auto_is_disk_locally_and_object_store_on_a_cluster() -> None:
    cfg = InferenceConfig()
    assert cfg.weight_sync == "auto"
    assert cfg.resolved_weight_sync(on_cluster=False) == "disk"
    assert cfg.resolved_weight_sync(on_cluster=True) == "object_store"
    assert InferenceConfig(weight_sync="state_dict").resolved_weight_sync(True) == "state_dict"


def test_object_store_needs_the_builtin_server() -> None:
    with pytest.raises(ConfigError, match="engine=builtin"):
        InferenceConfig(engine="vllm", weight_sync="object_store")
