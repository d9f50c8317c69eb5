"""``inference.weight_sync=nccl|ipc``: the learner ranks send through vLLM's own weight transfer.

The learner group and the servers are fakes that record the order of events; what vLLM's engine
does on the wire is in ``tests/serving/test_vllm_transfer*.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from areal_agents.errors import ConfigError, WeightSyncError
from areal_agents.trainers.config import InferenceConfig, LoraConfig, ModelConfig, TrainConfig
from areal_agents.trainers.inference import _create
from areal_agents.trainers.weight_sync import WeightSync


class Log(list[str]):
    pass


class FakeLearners:
    """The :class:`LearnerGroup` calls a vLLM push makes; ``servers`` take the version."""

    def __init__(self, log: Log, servers: list[Any], fail: bool = False) -> None:
        self.log, self.servers, self.fail = log, servers, fail
        self.init_kwargs: dict[str, Any] = {}

    def init_vllm_transfer(self, **kwargs: Any) -> None:
        self.log.append("init")
        self.init_kwargs = kwargs

    def send_vllm_weights(self, version: int) -> None:
        self.log.append(f"send {version}")
        if self.fail:
            raise WeightSyncError("update (/update_weights) on http://x: HTTP 500 worker failed")
        for server in self.servers:  # what /finish_weight_update does on each server
            server.version = version

    def export_weights(self, directory: Path) -> None:
        raise AssertionError("nothing goes through the disk")


class FakeServer:
    def __init__(self, log: Log, name: str) -> None:
        self.log, self.name = log, name
        self.version = 0
        self.base_url = f"http://{name}/v1"

    def pause(self) -> None:
        self.log.append(f"pause {self.name}")

    def resume(self) -> None:
        self.log.append(f"resume {self.name}")

    def weight_version(self) -> int:
        return self.version


def _cfg(mode: str = "nccl") -> InferenceConfig:
    return InferenceConfig(engine="vllm", weight_sync=mode, weight_bucket_mb=64)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["nccl", "ipc"])
def test_the_learners_send_while_the_servers_are_paused(tmp_path: Path, mode: str) -> None:
    log = Log()
    servers = [FakeServer(log, "a"), FakeServer(log, "b")]
    learners = FakeLearners(log, servers)
    sync = WeightSync(_cfg(mode), servers, tmp_path)  # type: ignore[arg-type]
    sync.push(learners, 1)
    sync.push(learners, 2)
    assert log == [
        "init",  # the rendezvous, once
        "pause a", "pause b", "send 1", "resume a", "resume b",
        "pause a", "pause b", "send 2", "resume a", "resume b",
    ]  # fmt: skip
    assert learners.init_kwargs == {
        "backend": mode,
        "base_urls": ["http://a/v1", "http://b/v1"],
        "timeout_s": 300.0,
        "bucket_bytes": 64 << 20,
    }
    assert sync.served_versions == [2, 2]
    assert not any(tmp_path.iterdir())  # no checkpoint on any disk
    # the learners send it themselves: even an overlapped push is over when it returns, so the
    # next step cannot reach the learners before they have sent this version
    sync.push_step(learners, 3, overlap=True)
    assert log[-3:] == ["send 3", "resume a", "resume b"] and sync.served_versions == [3, 3]


def test_a_failed_send_is_a_weight_sync_error_and_the_servers_resume(tmp_path: Path) -> None:
    log = Log()
    servers = [FakeServer(log, "a")]
    sync = WeightSync(_cfg(), servers, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(WeightSyncError, match="HTTP 500"):
        sync.push(FakeLearners(log, servers, fail=True), 1)
    assert log[-1] == "resume a"  # generation goes on (with the old weights) for the report


def test_vllms_transfer_is_configured_at_launch_and_only_for_vllm(tmp_path: Path) -> None:
    cfg = _cfg("nccl")
    from areal_agents.serving.model import default_model_path

    server = _create(cfg, str(default_model_path()), "policy", "127.0.0.1", None)
    flag = server.extra_args.index("--weight-transfer-config")
    assert json.loads(server.extra_args[flag + 1]) == {"backend": "nccl"}
    with pytest.raises(ConfigError, match=r"needs inference\.engine=vllm"):
        InferenceConfig(engine="builtin", weight_sync="nccl")
    with pytest.raises(ConfigError, match="weight_bucket_mb"):
        InferenceConfig(engine="vllm", weight_sync="nccl", weight_bucket_mb=0)
    with pytest.raises(ConfigError, match="sends the full weights"):
        TrainConfig(
            inference=_cfg("ipc"), model=ModelConfig(lora=LoraConfig(r=8, target_modules=("q",)))
        )
