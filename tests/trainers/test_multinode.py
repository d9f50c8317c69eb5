"""A training run attached to a 2-node Ray cluster on this machine's loopback.

``ray.cluster_utils.Cluster`` starts two raylets (two "nodes") on 127.0.0.1; the training
command attaches with ``ray.address=127.0.0.1:PORT``, finishes, and its learner, inference
server and rollout workers ran on both nodes (read from the GCS's actor table afterwards), and
the weights reached the server through Ray's object store, not the run directory; the
candidates for the final policy came to the driver's disk and were scored there.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal_agents.serving.staging import shm_root
from areal_agents.trainers.cluster import loopback_only

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths stay under 108 bytes
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RAY_worker_niceness", "0")
    loopback_only()
    node = {"num_cpus": 2, "object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        c.add_node(**node)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_run_attached_to_a_two_node_cluster_uses_both_nodes(cluster: Any, tmp_path: Path) -> None:
    import ray

    args = [
        "env=calculator",
        "model=tiny",
        "env.group_size=2",
        "trainer.groups_per_step=1",
        "trainer.total_steps=1",
        "eval.held_out_tasks=0",  # placement is the point here
        "eval.validation_tasks=2",  # and the final policy's choice, through the driver
        "trainer.rollout_workers=2",
        "inference.max_tokens=8",
        "inference.weight_sync=auto",  # object_store on a cluster
        "ray.placement_strategy=SPREAD",  # PACK (the default) would fit it on one node
        "log.progress=false",
        "log.tensorboard=false",
        f"ray.address={cluster.address}",
        "ray.connect_timeout_s=20",
        f"output_dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    staged = set(glob.glob(f"{shm_root()}/areal-weights-*"))
    done = subprocess.run(
        [sys.executable, "-m", "areal_agents.train", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    # weight_sync=auto went through the object store: nothing was written for the servers
    # under the run directory, which lives with the driver only
    assert not any((tmp_path / "run" / "weights").glob("v*"))
    # and the server's host staged them in its node's shared memory, removed at its stop
    assert set(glob.glob(f"{shm_root()}/areal-weights-*")) == staged
    # the candidates for the final policy came to the driver (learner rank 0 sent its files)
    # and were scored through the server; the one kept is a whole Hugging Face directory
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    chosen = summary["held_out"]["selection"]
    assert set(chosen["candidates"]) == {"0", "1"} and chosen["tasks"] == 2
    final = Path(summary["final_weights"])
    assert final.parent == tmp_path / "run" / "candidates"
    assert {"model.safetensors", "config.json"} <= {p.name for p in final.iterdir()}
    assert len(list((tmp_path / "run" / "eval" / "validation").iterdir())) == 2

    ray.init(address=cluster.address, _node_ip_address="127.0.0.1")
    try:
        nodes = {n["NodeID"] for n in ray.nodes()}
        actors = ray._private.state.actors().values()
        placed: dict[str, set[str]] = {}
        for actor in actors:
            placed.setdefault(actor["ActorClassName"], set()).add(actor["Address"]["NodeID"])
    finally:
        ray.shutdown()
    assert len(nodes) == 2
    used = set().union(*placed.values())
    assert used == nodes, placed  # the run's actors ran on both nodes
    assert placed["RolloutWorkerActor"] == nodes  # two workers, spread: one per node
    assert {"Learner", "_ServerHost"} <= placed.keys()
