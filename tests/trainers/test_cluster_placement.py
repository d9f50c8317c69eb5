"""The run's placement: a bundle per learner rank, server and rollout worker, checked against
the nodes before anything loads; what it says when the run does not fit; the object store
sized from the model. No Ray here except the last tests (a real placement group that cannot be
held, and a collective call that fails fast when a rank dies)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_agents.config import load_config
from areal_agents.errors import CapacityError, ConfigError, LearnerLost
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.modeling import tiny_model_path
from areal_agents.trainers.placement import (
    Bundle,
    NodeFree,
    Placement,
    capacity_message,
    check_local_capacity,
    fits,
    object_store_mb,
    run_bundles,
    weights_mb,
)

GB = 2**30
ROOT = Path(__file__).resolve().parents[2]


def cfg_of(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, ["env=calculator", "model=tiny", *overrides])


def node(name: str, cpus: float, memory_gb: float = 16, gpus: float = 0) -> NodeFree:
    free = {"CPU": cpus, "memory": memory_gb * GB, **({"GPU": gpus} if gpus else {})}
    return NodeFree(name, free, free)


def test_bundles_come_learners_first_then_each_server_with_its_workers() -> None:
    cfg = cfg_of(
        "trainer.learner_ranks=2",
        "inference.num_servers=2",
        "trainer.rollout_workers=3",
        "ray.actor_cpus=1",
        "ray.learner_gpus=1",
        "inference.gpus_per_server=0.5",
    )
    bundles = run_bundles(cfg, model_mb=100)
    assert [(b.kind, b.index) for b in bundles] == [
        ("learner", 0),
        ("learner", 1),
        ("server", 0),
        ("rollout_worker", 0),
        ("rollout_worker", 2),  # worker w talks to server w % num_servers
        ("server", 1),
        ("rollout_worker", 1),
    ]
    learner, server, worker = bundles[0], bundles[2], bundles[3]
    assert (learner.cpus, learner.gpus, server.gpus, worker.gpus) == (1, 1, 0.5, 0)
    # weights, gradients and Adam moments sharded over 2 ranks, plus a gathered copy
    assert learner.memory_mb == 100 * 3 + 512
    assert server.memory_mb == 100 * 2 + 512 and worker.memory_mb == 256
    assert learner.resources() == {"memory": learner.memory_mb * 2**20, "CPU": 1, "GPU": 1}


@pytest.mark.parametrize(("memory_mb", "reserved"), [(1000, 1000 * 2**20), (0, 2**20)])
def test_actor_memory_mb_replaces_the_estimate(memory_mb: int, reserved: int) -> None:
    bundles = run_bundles(cfg_of(f"ray.actor_memory_mb={memory_mb}"), model_mb=513)
    # 0 reserves none, but a bundle of zeros is refused by Ray: 1 MB stands for it
    assert {b.resources()["memory"] for b in bundles} == {reserved}


def test_weights_mb_reads_the_shapes_without_loading() -> None:
    fp32 = weights_mb(tiny_model_path(), "float32")
    assert 10 < fp32 < 100
    assert weights_mb(tiny_model_path(), "bfloat16") == pytest.approx(fp32 / 2)


def test_a_one_cpu_head_and_a_two_cpu_node_hold_three_one_cpu_actors_not_four() -> None:
    nodes = [node("head", 1), node("worker", 2)]
    three = run_bundles(cfg_of("ray.actor_cpus=1"), model_mb=25)
    assert len(three) == 3
    assert fits(three, nodes, "PACK") and fits(three, nodes, "SPREAD")
    four = run_bundles(cfg_of("ray.actor_cpus=1", "trainer.rollout_workers=2"), model_mb=25)
    assert not fits(four, nodes, "PACK")
    # STRICT_SPREAD: every bundle on a node of its own, so three need three nodes
    assert not fits(three, nodes, "STRICT_SPREAD")
    assert fits(three, [*nodes, node("third", 1)], "STRICT_SPREAD")


def test_the_capacity_message_says_what_is_needed_what_is_free_and_what_to_change() -> None:
    bundles = run_bundles(cfg_of("ray.actor_cpus=1", "trainer.rollout_workers=2"), model_mb=25)
    message = capacity_message(
        bundles, [node("head (ab12cd34, head)", 1), node("n2 (ef56)", 2)], "PACK", on_cluster=True
    )
    assert "1 learner rank x CPU 1" in message
    assert "1 inference server x CPU 1" in message
    assert "2 rollout workers x CPU 1, memory 256 MB" in message
    assert "in all: CPU 4" in message
    assert "node head (ab12cd34, head): CPU 1 of 1" in message
    assert "node n2 (ef56): CPU 2 of 2" in message
    assert "ray.actor_cpus" in message and "trainer.rollout_workers" in message
    assert "add nodes" in message and "ray.placement_timeout_s" in message
    gpus = [Bundle("learner", 0, 0, 1, 10)]
    on_gpu_less = capacity_message(gpus, [node("cpu-only", 2)], "PACK", on_cluster=True)
    assert "ray.learner_gpus" in on_gpu_less and "inference.gpus_per_server" in on_gpu_less


def test_a_local_run_that_cannot_fit_its_own_instance_is_refused_at_once() -> None:
    here = node("127.0.0.1 (this machine)", 2)
    cfg = cfg_of("ray.actor_cpus=1", "trainer.rollout_workers=2")  # 4 CPUs on 2
    with pytest.raises(CapacityError, match=r"ray\.num_cpus"):
        check_local_capacity(run_bundles(cfg, 25), here, "PACK")
    check_local_capacity(run_bundles(cfg_of("ray.actor_cpus=0.5"), 25), here, "PACK")
    # one node cannot spread three bundles strictly
    with pytest.raises(CapacityError, match="STRICT_SPREAD"):
        check_local_capacity(run_bundles(cfg_of(), 25), here, "STRICT_SPREAD")


def test_the_command_refuses_a_run_its_own_instance_cannot_hold_before_ray_starts(
    tmp_path: Path,
) -> None:
    """The issue's 3 one-CPU actors, on a local instance of 1 CPU: exit 2 within seconds, with
    the capacity error, before the run directory is set up or Ray starts."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    args = ["env=calculator", "model=tiny", "ray.num_cpus=1", "ray.actor_cpus=1"]
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "areal_agents.train", *args, f"output_dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert time.monotonic() - start < 120  # Python's imports and the model's headers only
    assert "run directory:" not in done.stdout and "Traceback" not in done.stderr
    message = done.stderr
    assert "does not fit the Ray instance (ray.placement_strategy=PACK)" in message
    assert "in all: CPU 3" in message and "(this machine): CPU 1 of 1" in message
    assert "ray.actor_cpus" in message and "ray.num_cpus" in message
    # nothing left behind: no run directory (Hydra's .hydra/, an empty checkpoints/) to clutter
    # runs/ or to shadow the default directory of the next run
    assert not (tmp_path / "run").exists()


def test_the_object_store_is_sized_from_the_model_or_a_small_one_is_refused() -> None:
    # the default model's 513 MB through the store (weight_sync=object_store)
    through = cfg_of("inference.weight_sync=object_store")
    assert object_store_mb(through, 513.1, on_cluster=False) >= 2 * 513
    small = cfg_of("inference.weight_sync=object_store", "ray.object_store_mb=256")
    with pytest.raises(ConfigError, match=r"ray\.object_store_mb=256 cannot hold.*513 MB"):
        object_store_mb(small, 513.1, on_cluster=False)
    # from disk (a local run's auto) nothing passes through: 256 MB is enough
    assert object_store_mb(cfg_of("ray.object_store_mb=256"), 513.1, on_cluster=False) == 256
    assert object_store_mb(cfg_of(), 513.1, on_cluster=False) == 256
    # on a cluster, auto is object_store: sized again
    assert object_store_mb(cfg_of(), 513.1, on_cluster=True) >= 2 * 513


def test_placement_strategy_must_be_one_of_rays() -> None:
    with pytest.raises(ConfigError, match=r"ray\.placement_strategy='RANDOM'.*STRICT_SPREAD"):
        cfg_of("ray.placement_strategy=RANDOM")


class LaidOut(Placement):
    """A placement whose bundles Ray has put on the given nodes (``nodes()`` reads them from
    the placement group's table; here they are given)."""

    def __init__(self, where: dict[tuple[str, int], str]) -> None:
        super().__init__(None, [Bundle(kind, index) for kind, index in where])
        self.where = where

    def nodes(self) -> dict[tuple[str, int], str]:
        return self.where


def test_a_rollout_worker_talks_to_the_servers_on_its_node_else_to_all() -> None:
    laid = LaidOut({
        ("server", 0): "A", ("server", 1): "B", ("server", 2): "A",
        ("rollout_worker", 0): "A", ("rollout_worker", 1): "B",
        ("rollout_worker", 2): "C",  # a node without a server
        ("rollout_worker", 3): "",  # not placed (its node just died)
    })  # fmt: skip
    assert laid.servers_near(0, 3) == [0, 2] and laid.servers_near(1, 3) == [1]
    assert laid.servers_near(2, 3) == laid.servers_near(3, 3) == [0, 1, 2]
    # after a node's death Ray moves its bundles: the worker follows its new node's servers
    laid.where[("rollout_worker", 1)] = "A"
    assert laid.servers_near(1, 3) == [0, 2]


# ---- with a real local Ray instance ------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    from areal_agents.trainers.config import RayConfig
    from areal_agents.trainers.runtime import start_ray, stop_ray

    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    start_ray(RayConfig(num_cpus=2, object_store_mb=80))
    yield
    stop_ray()


@pytest.mark.integration
def test_a_group_the_instance_cannot_hold_fails_within_its_timeout(local_ray: None) -> None:
    fitting = [Bundle("learner", 0, 1.0), Bundle("rollout_worker", 0, 1.0)]
    placement = Placement.reserve(fitting, "PACK", 10, on_cluster=False)
    try:
        nodes = placement.nodes()
        assert len(set(nodes.values())) == 1 and all(nodes.values())
        assert placement.servers_near(0, 2) == [0, 1]  # no server bundle: every server
        assert placement.options("rollout_worker", 0)["num_cpus"] == 1.0
    finally:
        placement.remove()
    too_big = [Bundle("learner", 0, 2.0), Bundle("rollout_worker", 0, 1.0)]
    start = time.monotonic()
    with pytest.raises(CapacityError) as info:
        Placement.reserve(too_big, "PACK", 1.5, on_cluster=False)
    assert 1.5 <= time.monotonic() - start < 15
    assert "waited 2 s" in str(info.value) and "CPU 2 of 2" in str(info.value)
    # nothing is left reserved: the fitting group is held again at once
    Placement.reserve(fitting, "PACK", 10, on_cluster=False).remove()


@pytest.mark.integration
def test_a_collective_call_fails_as_soon_as_one_rank_dies(local_ray: None) -> None:
    import ray

    from areal_agents.trainers.learner_group import gather

    @ray.remote(num_cpus=0)
    class Rank:
        def wait_for_peer(self) -> None:
            time.sleep(600)  # as a rank in an all-reduce whose peer is gone

        def die(self) -> None:
            os._exit(1)

    waiting, dying = Rank.remote(), Rank.remote()
    start = time.monotonic()
    with pytest.raises(LearnerLost, match="learner rank 1 died"):
        gather([waiting.wait_for_peer.remote(), dying.die.remote()])
    assert time.monotonic() - start < 60
    ray.kill(waiting)
