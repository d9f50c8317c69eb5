"""``inference.weight_sync=object_store``: a state dict in Ray's object store reaches a server
through one safetensors file in node-local shared memory, staged in place push after push, read
by any safetensors reader, served bit for bit, and removed at the end."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.errors import WeightSyncError
from areal_agents.serving.engine import Engine
from areal_agents.serving.staging import FILE_NAME, StagingFile, mapped_tensors, shm_root
from areal_agents.trainers.config import InferenceConfig
from areal_agents.trainers.modeling import tiny_model_path
from areal_agents.trainers.object_store import ShmLoader, from_arrays, to_arrays
from areal_agents.trainers.weight_sync import WeightSync


def _every_dtype() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(5, 3, generator=gen)
    return {
        "embed.weight": embed,
        "lm_head.weight": embed,  # tied: shares the embedding's storage
        "bf": torch.randn(7, generator=gen).to(torch.bfloat16),
        "half": torch.randn(2, 2, generator=gen).to(torch.float16),
        "ids": torch.arange(3),
        "flags": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(2.5),
    }


@pytest.fixture
def staging() -> Iterator[StagingFile]:
    s = StagingFile()
    yield s
    s.close()


def test_the_staged_file_is_safetensors_bit_for_bit_without_the_tied_copy(
    staging: StagingFile,
) -> None:
    from safetensors import safe_open

    state = _every_dtype()
    directory = staging.write(state)
    assert str(directory).startswith(shm_root()) and os.listdir(directory) == [FILE_NAME]
    with safe_open(str(directory / FILE_NAME), framework="pt") as f:
        assert sorted(f.keys()) == sorted(set(state) - {"lm_head.weight"})
        assert f.metadata() == {"format": "pt"}
        for name in f.keys():  # noqa: SIM118 (safe_open is no dict)
            tensor = f.get_tensor(name)
            assert tensor.dtype == state[name].dtype and torch.equal(tensor, state[name]), name
    views = mapped_tensors(directory / FILE_NAME)  # what the built-in server reads
    assert sorted(views) == sorted(set(state) - {"lm_head.weight"})
    for name, view in views.items():
        assert view.dtype == state[name].dtype and torch.equal(view, state[name]), name


def test_the_staged_file_is_rewritten_in_place_and_removed_on_close() -> None:
    staging = StagingFile()
    first = {"w": torch.zeros(4, 3), "b": torch.zeros(3)}
    directory = staging.write(first)
    path = directory / FILE_NAME
    inode = path.stat().st_ino
    views = mapped_tensors(path)  # a reader's map of the file, kept across the next write
    second = {"w": torch.ones(4, 3), "b": torch.full((3,), 2.0)}
    assert staging.write(second) == directory
    assert path.stat().st_ino == inode  # the same file (and tmpfs pages): rewritten in place
    assert torch.equal(views["w"], second["w"]) and torch.equal(views["b"], second["b"])
    staging.write({"w": torch.ones(5, 3)})  # another size: a new file in the same place
    assert path.stat().st_ino != inode and os.listdir(directory) == [FILE_NAME]
    assert torch.equal(views["b"], second["b"])  # a reader of the old file keeps its bytes
    assert torch.equal(mapped_tensors(path)["w"], torch.ones(5, 3))
    staging.close()
    assert not directory.exists()
    staging.close()  # idempotent


def test_staging_dirs_of_dead_writers_are_removed_and_live_ones_kept(
    staging: StagingFile,
) -> None:
    code = "import os; print(os.getpid())"
    dead = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    namespace = os.stat("/proc/self/ns/pid").st_ino
    orphan = Path(shm_root()) / f"areal-weights-{namespace}-{int(dead.stdout)}-test"
    orphan.mkdir()
    (orphan / FILE_NAME).write_bytes(b"x" * 64)
    live = StagingFile()
    try:
        live_dir = live.write({"a": torch.ones(2)})
        directory = staging.write({"a": torch.ones(2)})  # a new staging file reaps orphans
        assert not orphan.exists()
        assert live_dir.exists() and directory.exists()  # this process is alive
    finally:
        live.close()


def test_a_full_shared_memory_falls_back_to_the_temp_dir_or_fails_typed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = os.posix_fallocate

    def fallocate(fd: int, offset: int, size: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(shm_root() + "/"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, offset, size)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    staging = StagingFile()
    try:
        directory = staging.write({"a": torch.ones(2)})
        assert directory.parent == tmp_path  # staged in the temp directory instead
        assert [p.name for p in Path(shm_root()).glob(f"areal-weights-*-{os.getpid()}-*")] == []
    finally:
        staging.close()
    pinned = StagingFile(root=shm_root())
    with pytest.raises(WeightSyncError, match="no room for a"):
        pinned.write({"a": torch.ones(2)})
    assert pinned.directory is None  # nothing left behind


@pytest.mark.parametrize(
    "content",
    [b"\x01", (10**6).to_bytes(8, "little") + b"{}", (2).to_bytes(8, "little") + b"[]"],
    ids=["too short", "header past the end", "not an object"],
)
def test_a_file_that_is_not_safetensors_is_a_weight_sync_error(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    with pytest.raises(WeightSyncError, match="is not a safetensors file"):
        mapped_tensors(path)


def test_an_entry_outside_the_file_is_a_weight_sync_error(tmp_path: Path) -> None:
    header = b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
    path = tmp_path / FILE_NAME
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)  # 8 of 16 bytes
    with pytest.raises(WeightSyncError, match="outside the file"):
        mapped_tensors(path)


def test_arrays_round_trip_every_dtype_and_drop_a_tied_copy() -> None:
    embed = torch.randn(3, 2)
    state = {"embed": embed, "head": embed, "bf": torch.randn(4).to(torch.bfloat16)}
    arrays = to_arrays(state)
    assert sorted(arrays) == ["bf", "embed"]
    back = from_arrays(arrays)
    assert back["bf"].dtype == torch.bfloat16 and torch.equal(back["bf"], state["bf"])
    assert torch.equal(back["embed"], embed)


class LoadingServer:
    """Loads what it is given from disk with safetensors itself, as any reader would."""

    def __init__(self) -> None:
        self.version = 0
        self.loaded: dict[str, torch.Tensor] = {}
        self.paths: list[str] = []
        self.inodes: list[int] = []

    def update_weights_from_disk(self, path: str, version: int, timeout: float) -> None:
        from safetensors.torch import load_file

        self.paths.append(path)
        self.inodes.append((Path(path) / FILE_NAME).stat().st_ino)
        self.loaded = {k: v.clone() for k, v in load_file(str(Path(path) / FILE_NAME)).items()}
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


class EngineServer:
    """The built-in server's ``/update_weights_from_disk`` route, without the HTTP."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def update_weights_from_disk(self, path: str, version: int, timeout: float) -> None:
        self.engine.update_weights_from_disk(path, version)


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    from areal_agents.trainers.config import RayConfig
    from areal_agents.trainers.runtime import start_ray, stop_ray

    start_ray(RayConfig(num_cpus=1, object_store_mb=80))
    yield
    stop_ray()


def test_a_push_stages_once_for_every_local_server_and_reuses_the_file(
    ray_local: None, tmp_path: Path
) -> None:
    state = {"w": torch.randn(4, 3), "b": torch.randn(3).to(torch.bfloat16)}
    servers = [LoadingServer(), LoadingServer()]
    sync = WeightSync(InferenceConfig(weight_sync="object_store"), servers, tmp_path)
    sync.push(RefLearners(state), 1)
    newer = {k: v + 1 for k, v in state.items()}
    sync.push(RefLearners(newer), 2)
    with pytest.raises(WeightSyncError, match="no weights"):  # rank 0 returned nothing
        sync.push(RefLearners({}), 3)
    for server in servers:
        assert server.version == 2
        assert torch.equal(server.loaded["w"], newer["w"])
        assert torch.equal(server.loaded["b"], newer["b"])
    paths = {p for s in servers for p in s.paths}
    assert len(paths) == 1  # one file staged for both servers, the same at every push
    assert len({i for s in servers for i in s.inodes}) == 1  # rewritten in place
    assert list(tmp_path.iterdir()) == []  # nothing under the run directory
    sync.close()
    assert not os.path.exists(paths.pop())  # the shared-memory copy is gone


def test_the_built_in_engine_serves_the_pushed_weights_bit_for_bit(ray_local: None) -> None:
    import ray
    from transformers import AutoModelForCausalLM

    engine = Engine(tiny_model_path(), max_batch_size=2)
    loader = ShmLoader()
    try:
        learner = AutoModelForCausalLM.from_pretrained(tiny_model_path(seed=1))  # other weights
        state = learner.state_dict()
        loader.load([EngineServer(engine)], [ray.put(to_arrays(state))], 1, 60)
        served = engine.model.state_dict()
        assert engine.weight_version == 1
        assert sorted(served) == sorted(state)
        for name, tensor in state.items():  # the tied head included (staged once, as embed)
            assert torch.equal(served[name], tensor), name
        before = {k: v.clone() for k, v in served.items()}
        wrong = {**state, "model.norm.weight": torch.ones(3)}
        with pytest.raises(WeightSyncError, match=r"model\.norm\.weight: shape"):
            loader.load([EngineServer(engine)], [ray.put(to_arrays(wrong))], 2, 60)
        with pytest.raises(WeightSyncError, match="version must increase"):
            loader.load([EngineServer(engine)], [ray.put(to_arrays(state))], 1, 60)
        assert engine.weight_version == 1 and not engine.is_paused
        for name, tensor in engine.model.state_dict().items():  # nothing was half-copied
            assert torch.equal(tensor, before[name]), name
    finally:
        loader.close()
        engine.close()


def test_auto_is_disk_locally_and_object_store_on_a_cluster_for_every_engine() -> None:
    cfg = InferenceConfig()
    assert cfg.weight_sync == "auto"
    assert cfg.resolved_weight_sync(on_cluster=False) == "disk"
    assert cfg.resolved_weight_sync(on_cluster=True) == "object_store"
    vllm = InferenceConfig(engine="vllm")
    assert vllm.resolved_weight_sync(on_cluster=True) == "object_store"  # no shared disk needed
    assert vllm.resolved_weight_sync(on_cluster=False) == "disk"
    assert InferenceConfig(engine="vllm", weight_sync="object_store").weight_sync == "object_store"
    assert InferenceConfig(weight_sync="state_dict").resolved_weight_sync(True) == "state_dict"
