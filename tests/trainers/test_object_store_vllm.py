"""``inference.weight_sync=object_store`` with vLLM: what ``auto`` picks on a cluster.

A real vLLM server runs inside a server-host actor, as on a cluster node (a local Ray instance:
the actor's node is this machine, but the push takes the cluster's path: the reference is
resolved and staged in shared memory by the host actor, and vLLM reloads from that file, so no
disk is shared with the driver). The weights it then serves are those pushed: its greedy tokens
match those after a reload of the same weights from a checkpoint on disk.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.errors import WeightSyncError
from areal_agents.serving.staging import shm_root
from areal_agents.trainers.config import InferenceConfig
from areal_agents.trainers.object_store import to_arrays

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(1200),
]


class RefLearners:
    """Rank 0's state dict left in the object store, as ``LearnerGroup.state_ref`` does."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def state_ref(self) -> Any:
        import ray

        return ray.put(to_arrays(self.state))


@pytest.fixture
def ray_local(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from areal_agents.trainers.config import RayConfig
    from areal_agents.trainers.runtime import start_ray, stop_ray
    from tests.conftest import vllm_python

    python = vllm_python()
    if python is None:  # conftest has skipped (or failed) the test already
        pytest.skip("no vLLM environment")
    monkeypatch.setenv("AREAL_VLLM_PYTHON", str(python))  # the host actor's launcher reads it
    start_ray(RayConfig(num_cpus=1, object_store_mb=1200))
    yield
    stop_ray()


def _greedy(server: Any, prompt: list[int]) -> list[int]:
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
    reply = client.completions.create(
        model="policy",
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    return list(reply.choices[0].model_extra["token_ids"])  # type: ignore[index]


def test_vllm_on_a_server_host_serves_what_the_object_store_push_sent(
    ray_local: None, model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    from areal_agents.trainers.inference import start_servers, stop_servers
    from areal_agents.trainers.placement import Bundle, Placement
    from areal_agents.trainers.weight_sync import WeightSync

    base = load_file(str(model_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    noisy = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) if ".mlp." in k else v
        for k, v in base.items()
    }
    noisy_dir = tmp_path / "noisy"
    noisy_dir.mkdir()
    save_file(noisy, str(noisy_dir / "model.safetensors"))
    cfg = InferenceConfig(engine="vllm", startup_timeout_s=900)
    staged_before = set(glob.glob(f"{shm_root()}/areal-weights-*"))
    # a bundle of the server alone: the server is hosted by an actor in it, as on a cluster
    placement = Placement.reserve(
        [Bundle("server", 0, memory_mb=1024)], "PACK", 60, on_cluster=True
    )
    servers = start_servers(cfg, model_dir, "policy", placement=placement)
    try:
        (server,) = servers
        assert hasattr(server, "update_weights_from_ref")  # hosted by an actor, as on a cluster
        sync = WeightSync(cfg, servers, tmp_path / "weights", on_cluster=True)
        assert sync.mode == "object_store"  # auto, on a cluster, for vLLM
        prompt = tokenizer.encode("The capital of France is", add_special_tokens=False)
        before = _greedy(server, prompt)
        sync.push(RefLearners(noisy), 1)
        pushed = _greedy(server, prompt)
        assert sync.served_versions == [1] and pushed != before
        sync.push(RefLearners(base), 2)
        assert _greedy(server, prompt) == before  # the original weights, back through the store
        server.update_weights_from_disk(str(noisy_dir), 3, timeout=300)
        assert _greedy(server, prompt) == pushed  # the same weights from disk: the same tokens
        wrong = {"model.embed_tokens.weight": torch.zeros(10, 576)}
        with pytest.raises(WeightSyncError, match="shape"):  # checked before vLLM loads it
            sync.push(RefLearners(wrong), 4)
        assert server.weight_version() == 3 and _greedy(server, prompt) == pushed
        assert not (tmp_path / "weights").exists()  # nothing under the run directory
        staged = set(glob.glob(f"{shm_root()}/areal-weights-*")) - staged_before
        assert len(staged) == 1  # the host's one staged file, reused at every push
    finally:
        stop_servers(servers)
        placement.remove()
    assert set(glob.glob(f"{shm_root()}/areal-weights-*")) == staged_before  # removed at stop
