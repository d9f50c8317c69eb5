"""The weight push: every server gets the version, a stuck or failing server is a clear error."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from areal_agents.errors import WeightSyncError
from areal_agents.trainers.config import InferenceConfig
from areal_agents.trainers.weight_sync import WeightSync


class FakeLearners:
    """Writes a marker file where the learner would write safetensors."""

    def export_weights(self, directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_text("weights")

    def full_state(self) -> dict[str, object]:
        return {"w": 1}


class FakeServer:
    """Records pushes; may hang or fail (what a wedged or broken server does)."""

    def __init__(self, hang: bool = False, fail: bool = False, lie: bool = False) -> None:
        self.hang, self.fail, self.lie = hang, fail, lie
        self.version = 0
        self.paths: list[str] = []
        self.release = threading.Event()

    def update_weights_from_disk(self, path: str, version: int, timeout: float) -> None:
        if self.hang:
            self.release.wait(30)
        if self.fail:
            raise WeightSyncError("weights do not fit the model: shape (1,) != (2,)")
        assert Path(path, "model.safetensors").is_file()
        self.paths.append(path)
        self.version = version if not self.lie else version - 1

    def update_weights_from_state_dict(self, state: object, version: int, timeout: float) -> None:
        self.version = version

    def weight_version(self) -> int:
        return self.version


def test_push_reaches_every_server_and_keeps_only_the_latest_weights(tmp_path: Path) -> None:
    servers = [FakeServer(), FakeServer()]
    sync = WeightSync(InferenceConfig(), servers, tmp_path)
    for version in (1, 2, 3):
        sync.push(FakeLearners(), version)
    assert [s.version for s in servers] == [3, 3]
    assert sync.served_versions == [3, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["v000003"]


def test_state_dict_push(tmp_path: Path) -> None:
    server = FakeServer()
    WeightSync(InferenceConfig(weight_sync="state_dict"), [server], tmp_path).push(
        FakeLearners(), 1
    )
    assert server.version == 1


def test_a_stuck_server_fails_within_the_timeout(tmp_path: Path) -> None:
    stuck = FakeServer(hang=True)
    cfg = InferenceConfig(weight_sync_timeout_s=0.5)
    sync = WeightSync(cfg, [FakeServer(), stuck], tmp_path)
    sync.grace_s = 0.5
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match="did not answer"):
        sync.push(FakeLearners(), 1)
    assert time.monotonic() - start < 10
    stuck.release.set()


def test_failures_and_wrong_versions_are_weight_sync_errors(tmp_path: Path) -> None:
    with pytest.raises(WeightSyncError, match="do not fit"):
        WeightSync(InferenceConfig(), [FakeServer(fail=True)], tmp_path / "a").push(
            FakeLearners(), 1
        )
    with pytest.raises(WeightSyncError, match="serve"):
        WeightSync(InferenceConfig(), [FakeServer(lie=True)], tmp_path / "b").push(
            FakeLearners(), 1
        )


class GatedServer(FakeServer):
    """Loads a version only once ``gate`` is set: a server still busy loading."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def update_weights_from_state_dict(self, state: object, version: int, timeout: float) -> None:
        assert self.gate.wait(30)
        self.version = version


class SnapshotLearners:
    """Hands over its weights as the state dict push takes them; counts the snapshots."""

    def __init__(self) -> None:
        self.weights = {"w": 0}
        self.snapshots: list[dict[str, int]] = []

    def full_state(self) -> dict[str, int]:
        self.snapshots.append(dict(self.weights))
        return self.snapshots[-1]


def test_start_takes_the_snapshot_at_once_and_the_servers_load_it_in_the_background(
    tmp_path: Path,
) -> None:
    server, learners, served = GatedServer(), SnapshotLearners(), []
    sync = WeightSync(InferenceConfig(weight_sync="state_dict"), [server], tmp_path)
    assert sync.served_versions == [0]
    pending = sync.start(learners, 1, on_served=served.append)
    assert learners.snapshots == [{"w": 0}]  # taken before start returned
    learners.weights["w"] = 1  # the next step trains on: the push is not affected
    time.sleep(0.2)
    assert not pending.done() and served == [] and sync.served_versions == [0]
    server.gate.set()
    assert pending.wait() > 0
    assert served == [1] and server.version == 1 and sync.served_versions == [1]


def test_push_step_overlaps_only_when_asked_and_joins_the_previous_push(tmp_path: Path) -> None:
    server, learners, served = GatedServer(), SnapshotLearners(), []
    sync = WeightSync(InferenceConfig(weight_sync="state_dict"), [server], tmp_path)
    sync.push_step(learners, 1, overlap=True, on_served=served.append)
    assert served == []  # returned while the server still loads version 1
    threading.Timer(0.3, server.gate.set).start()
    held = sync.push_step(learners, 2, overlap=True, on_served=served.append)
    assert held >= 0.25  # the second push waited for the first one to be served
    assert served[0] == 1
    sync.join()
    assert served == [1, 2] and server.version == 2

    gated = GatedServer()
    serial = WeightSync(InferenceConfig(weight_sync="state_dict"), [gated], tmp_path)
    threading.Timer(0.3, gated.gate.set).start()
    held = serial.push_step(learners, 1, overlap=False)
    assert held >= 0.25 and gated.version == 1  # without overlap it returns once served


def test_an_overlapped_push_that_fails_raises_when_joined(tmp_path: Path) -> None:
    sync = WeightSync(InferenceConfig(), [FakeServer(fail=True)], tmp_path)
    sync.push_step(FakeLearners(), 1, overlap=True)
    with pytest.raises(WeightSyncError, match="do not fit"):
        sync.join()
