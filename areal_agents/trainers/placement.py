"""Where the run's actors go: one Ray placement group, checked against the cluster first.

The run asks Ray for one placement group with a bundle per learner rank, inference server and
rollout worker (:func:`run_bundles`), each holding what that actor reserves: ``ray.actor_cpus``
CPUs, its GPUs (``ray.learner_gpus``, ``inference.gpus_per_server``) and memory estimated from
the model (``ray.actor_memory_mb`` overrides it). The bundles come in the order learner ranks,
then each server followed by the rollout workers that talk to it, so that ``PACK`` (the
default ``ray.placement_strategy``) keeps the learner ranks together and each server beside
its workers; ``SPREAD`` and ``STRICT_SPREAD`` lay them over the nodes instead.

:meth:`Placement.reserve` waits at most ``ray.placement_timeout_s`` for the cluster to hold
the group; when it cannot, the run fails with :class:`~areal_agents.errors.CapacityError`,
whose message lists what the run needs per actor kind, what every node has free, and the keys
to change (:func:`capacity_message`). A local run is checked before anything starts
(:func:`check_local_capacity`), against the instance it is about to start.

Every actor is then created in its own bundle (:meth:`Placement.options`); one that is
restarted after a death goes back into the same bundle, which Ray moves to a live node when
its node is gone. A rollout worker talks to the servers on its own node
(:meth:`Placement.servers_near`), to all of them when none is there.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_agents.errors import CapacityError, ConfigError

if TYPE_CHECKING:
    from areal_agents.trainers.config import TrainConfig

__all__ = [
    "KINDS",
    "Bundle",
    "NodeFree",
    "Placement",
    "capacity_message",
    "check_local_capacity",
    "fits",
    "object_store_mb",
    "run_bundles",
    "weights_mb",
]

KINDS = {
    "learner": "learner rank",
    "server": "inference server",
    "rollout_worker": "rollout worker",
}
"""Actor kinds with a bundle each, and how messages name them."""

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_MIN_MEMORY = 2**20  # a bundle reserves at least this (Ray refuses a bundle of zeros)
WORKER_MEMORY_MB = 256
"""A rollout worker's memory estimate: its tokenizer, environments and episodes in flight."""
OVERHEAD_MB = 512
"""A learner rank's or server's memory beyond its weights: the Python process, torch, buffers."""


@dataclass(frozen=True)
class Bundle:
    """What one actor reserves: CPUs, GPUs and memory (MB)."""

    kind: str
    """``learner``, ``server`` or ``rollout_worker`` (:data:`KINDS`)."""
    index: int
    cpus: float = 0.0
    gpus: float = 0.0
    memory_mb: int = 0

    def resources(self) -> dict[str, float]:
        """The bundle as Ray takes it (``memory`` in bytes, at least 1 MB: never all zeros)."""
        out = {"memory": float(max(self.memory_mb * 2**20, _MIN_MEMORY))}
        if self.cpus:
            out["CPU"] = self.cpus
        if self.gpus:
            out["GPU"] = self.gpus
        return out


@dataclass(frozen=True)
class NodeFree:
    """A node's free and total resources (CPU, GPU, memory in bytes)."""

    name: str
    free: Mapping[str, float]
    total: Mapping[str, float]


def weights_mb(model_dir: Path, dtype: str = "float32") -> float:
    """The model's weights in MB when held in ``dtype`` (the learner's ``model.dtype``), from
    the parameter shapes in its safetensors headers (nothing is loaded)."""
    params = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                params += math.prod(entry["shape"])
    return params * _DTYPE_BYTES.get(dtype, 4) / 2**20


def run_bundles(cfg: TrainConfig, model_mb: float) -> list[Bundle]:
    """The run's bundles in placement order: learner ranks, then each server followed by the
    rollout workers paired with it (worker ``w`` with server ``w % num_servers``)."""
    ray, world = cfg.ray, cfg.trainer.learner_ranks

    def memory(estimate: float) -> int:
        return int(ray.actor_memory_mb if ray.actor_memory_mb is not None else math.ceil(estimate))

    # a rank holds its shard of weights, gradients and two Adam moments, and gathers the full
    # weights for a push or a checkpoint; a server holds its weights and its caches
    learner_mb = memory(model_mb * (4 / world + 1) + OVERHEAD_MB)
    server_mb = memory(model_mb * 2 + OVERHEAD_MB)
    worker_mb = memory(WORKER_MEMORY_MB)
    out = [Bundle("learner", r, ray.actor_cpus, ray.learner_gpus, learner_mb) for r in range(world)]
    servers, workers = cfg.inference.num_servers, cfg.trainer.rollout_workers
    for s in range(servers):
        out.append(Bundle("server", s, ray.actor_cpus, cfg.inference.gpus_per_server, server_mb))
        out += [
            Bundle("rollout_worker", w, ray.actor_cpus, 0.0, worker_mb)
            for w in range(s, workers, servers)
        ]
    return out


def object_store_mb(cfg: TrainConfig, model_mb: float, *, on_cluster: bool) -> int:
    """The object store of the local instance: ``ray.object_store_mb``, or sized from the model
    when unset (twice the weights that pass through it, at least 256 MB). Raises
    :class:`ConfigError` before anything starts when a size that was given cannot hold the
    weights ``inference.weight_sync`` passes through the store (``object_store``,
    ``state_dict``: the whole model; with LoRA, or from disk, none)."""
    mode = cfg.inference.resolved_weight_sync(on_cluster)
    through = mode in ("object_store", "state_dict") and not cfg.model.lora.enabled
    need = math.ceil(model_mb) + 64 if through else 0  # 64 MB: batches, checkpoint parts
    given = cfg.ray.object_store_mb
    if given is None:
        return max(256, 2 * need)
    if given < need:
        raise ConfigError(
            f"ray.object_store_mb={given} cannot hold the model's weights ({model_mb:.0f} MB "
            f"in {cfg.model.dtype}), which inference.weight_sync={mode} passes through Ray's "
            f"object store: set ray.object_store_mb={2 * need} or more, or leave it unset "
            "(sized from the model), or use inference.weight_sync=disk"
        )
    return given


def fits(bundles: Sequence[Bundle], nodes: Sequence[NodeFree], strategy: str) -> bool:
    """Whether ``bundles`` fit the nodes' free resources (first fit, largest first; every
    bundle on a node of its own with ``STRICT_SPREAD``). Exact for one node."""
    free = [dict(n.free) for n in nodes]
    used: set[int] = set()
    for bundle in sorted(bundles, key=lambda b: (-b.gpus, -b.cpus, -b.memory_mb)):
        need = bundle.resources()
        for i, left in enumerate(free):
            if strategy == "STRICT_SPREAD" and i in used:
                continue
            if all(left.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
                for k, v in need.items():
                    left[k] = left.get(k, 0.0) - v
                used.add(i)
                break
        else:
            return False
    return True


def _amount(key: str, value: float) -> str:
    if key == "memory":
        mb = value / 2**20
        return f"memory {mb / 1024:.1f} GB" if mb >= 1024 else f"memory {mb:.0f} MB"
    return f"{key} {value:g}"


def _describe(resources: Mapping[str, float]) -> str:
    keys = [k for k in ("CPU", "GPU", "memory") if k in resources or k == "CPU"]
    return ", ".join(_amount(k, float(resources.get(k, 0.0))) for k in keys)


def capacity_message(
    bundles: Sequence[Bundle],
    nodes: Sequence[NodeFree],
    strategy: str,
    *,
    on_cluster: bool,
    waited_s: float | None = None,
) -> str:
    """What the run needs (per actor kind, and in all), what each node has free, and the keys
    that change either."""
    waited = f", waited {waited_s:.0f} s" if waited_s is not None else ""
    lines = [
        f"the run does not fit the Ray {'cluster' if on_cluster else 'instance'} "
        f"(ray.placement_strategy={strategy}{waited}).",
        "  it needs:",
    ]
    total: dict[str, float] = {}
    for kind, label in KINDS.items():
        mine = [b for b in bundles if b.kind == kind]
        if not mine:
            continue
        each = {**mine[0].resources(), **({"CPU": mine[0].cpus} if not mine[0].cpus else {})}
        lines.append(f"    {len(mine)} {label}{'s' if len(mine) > 1 else ''} x {_describe(each)}")
        for b in mine:
            for k, v in b.resources().items():
                total[k] = total.get(k, 0.0) + v
    lines.append(f"    in all: {_describe(total)} in {len(bundles)} bundles")
    lines.append("  free now:")
    for node in nodes:
        free = {k: node.free.get(k, 0.0) for k in ("CPU", "GPU", "memory") if k in node.total}
        of = {k: node.total.get(k, 0.0) for k in free}
        parts = ", ".join(
            f"{_amount(k, free[k])} of {_amount(k, of[k]).split(' ', 1)[1]}" for k in free
        )
        lines.append(f"    node {node.name}: {parts}")
    if not nodes:
        lines.append("    (no node is alive)")
    short = {k for k, v in total.items() if v > sum(n.free.get(k, 0.0) for n in nodes) + 1e-9}
    keys = []
    if "CPU" in short or not short:
        keys.append("ray.actor_cpus (CPUs per actor)")
    if "GPU" in short:
        keys += ["ray.learner_gpus", "inference.gpus_per_server"]
    if "memory" in short or not short:
        keys.append("ray.actor_memory_mb (memory per actor)")
    keys += ["trainer.learner_ranks", "inference.num_servers", "trainer.rollout_workers"]
    if strategy != "PACK" or not short:
        keys.append("ray.placement_strategy")
    where = (
        "or add nodes to the cluster (ray.placement_timeout_s: how long to wait for them)"
        if on_cluster
        else "or give the local instance more (ray.num_cpus; it starts with this machine's "
        "GPUs and memory)"
    )
    lines.append(f"  change: {', '.join(keys)}; {where}")
    return "\n".join(lines)


def _node_name(node: Mapping[str, Any]) -> str:
    ip = node.get("NodeManagerAddress", "?")
    head = ", head" if "node:__internal_head__" in node.get("Resources", {}) else ""
    return f"{ip} ({str(node.get('NodeID', ''))[:8]}{head})"


def cluster_free() -> list[NodeFree]:
    """Every alive node's free and total resources (Ray must be initialised)."""
    import ray
    from ray._private import state

    available = state.available_resources_per_node()
    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        total = {k: float(v) for k, v in node.get("Resources", {}).items()}
        free = {k: float(v) for k, v in available.get(node["NodeID"], {}).items()}
        out.append(NodeFree(_node_name(node), free, total))
    return out


def local_free(num_cpus: int, object_store_mb: int) -> NodeFree:
    """The resources of the local instance :func:`~areal_agents.trainers.runtime.start_ray`
    is about to start: ``num_cpus`` CPUs, the GPUs Ray will find, the memory it will offer."""
    from ray._private.accelerators import NvidiaGPUAcceleratorManager
    from ray._private.utils import estimate_available_memory

    gpus = NvidiaGPUAcceleratorManager.get_current_node_num_accelerators()
    memory = float(estimate_available_memory() - object_store_mb * 2**20)
    total = {"CPU": float(num_cpus), "GPU": float(gpus), "memory": memory}
    if not gpus:
        total.pop("GPU")
    return NodeFree("127.0.0.1 (this machine)", total, total)


def check_local_capacity(bundles: Sequence[Bundle], node: NodeFree, strategy: str) -> None:
    """Raise :class:`CapacityError` when ``bundles`` cannot fit the local instance ``node``."""
    if not fits(bundles, [node], strategy):
        raise CapacityError(capacity_message(bundles, [node], strategy, on_cluster=False))


class Placement:
    """The run's placement group: a bundle per actor, and the actor options that use it."""

    def __init__(self, group: Any, bundles: Sequence[Bundle], strategy: str = "PACK") -> None:
        self.group = group
        self.bundles = list(bundles)
        self.strategy = strategy
        self._slot = {(b.kind, b.index): i for i, b in enumerate(self.bundles)}

    @classmethod
    def reserve(
        cls,
        bundles: Sequence[Bundle],
        strategy: str,
        timeout_s: float,
        *,
        on_cluster: bool,
        poll_s: float = 0.5,
        on_wait: Callable[[float], None] | None = None,
    ) -> Placement:
        """Create the placement group and wait until Ray holds every bundle; after
        ``timeout_s``, remove it and raise :class:`CapacityError` with what is missing."""
        from ray.util.placement_group import placement_group, remove_placement_group

        start = time.monotonic()
        group = placement_group([b.resources() for b in bundles], strategy=strategy)
        while True:
            left = timeout_s - (time.monotonic() - start)
            if group.wait(timeout_seconds=max(0.0, min(poll_s, left))):
                return cls(group, bundles, strategy)
            if left <= 0:
                nodes = cluster_free()  # read while the group holds nothing
                remove_placement_group(group)
                raise CapacityError(
                    capacity_message(
                        bundles, nodes, strategy, on_cluster=on_cluster, waited_s=timeout_s
                    )
                )
            if on_wait is not None:
                on_wait(time.monotonic() - start)

    def wait_placed(self, timeout_s: float, what: str, *, on_cluster: bool = True) -> None:
        """Return once every bundle has a node (Ray moves those of a node that left); after
        ``timeout_s``, raise :class:`CapacityError` saying that ``what`` cannot start again."""
        if self.group.wait(timeout_seconds=timeout_s):
            return
        message = capacity_message(
            self.bundles, cluster_free(), self.strategy, on_cluster=on_cluster, waited_s=timeout_s
        )
        raise CapacityError(f"{what} cannot be started again: {message}")

    def options(self, kind: str, index: int) -> dict[str, Any]:
        """``.options(...)`` of the actor in bundle ``(kind, index)``: its resources and the
        bundle it runs in."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        slot = self._slot[(kind, index)]
        bundle = self.bundles[slot]
        return {
            "num_cpus": bundle.cpus,
            "num_gpus": bundle.gpus,
            "memory": bundle.resources()["memory"],
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group,
                placement_group_bundle_index=slot,
                placement_group_capture_child_tasks=False,
            ),
        }

    def nodes(self) -> dict[tuple[str, int], str]:
        """``(kind, index) -> node id`` of every bundle now (a bundle moves when its node
        dies)."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(self.group).get("bundles_to_node_id", {})
        return {key: str(table.get(slot, "")) for key, slot in self._slot.items()}

    def servers_near(self, worker: int, num_servers: int) -> list[int]:
        """The servers on rollout worker ``worker``'s node; all of them if none is there."""
        nodes = self.nodes()
        mine = nodes.get(("rollout_worker", worker), "")
        near = [s for s in range(num_servers) if mine and nodes.get(("server", s)) == mine]
        return near or list(range(num_servers))

    def remove(self) -> None:
        """Give the bundles back to the cluster (best effort)."""
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):  # Ray already gone
            remove_placement_group(self.group)
