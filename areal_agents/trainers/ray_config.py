"""Where the training run's processes live: a local Ray instance or an existing cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from areal_agents.config_values import check_numbers
from areal_agents.errors import ConfigError

__all__ = ["PlacementStrategy", "RayConfig"]

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_SPREAD"]
"""How the run's placement group lays its bundles on the nodes (Ray's strategies)."""


@dataclass
class RayConfig:
    """Where processes run: a local Ray instance (default) or an existing cluster."""

    address: str | None = None
    """Attach to a running cluster (``HOST:PORT`` of the head's GCS, ``auto`` or
    ``ray://HOST:PORT``); None starts a local one bound to 127.0.0.1."""
    num_cpus: int | None = None
    """CPUs of the local instance (None: all of this machine's)."""
    actor_cpus: float = 0.0
    """CPUs reserved per actor (each learner rank, server and rollout worker); 0 lets every
    process share the machine (small hosts)."""
    learner_gpus: float = 0.0
    """GPUs per learner rank (1 on GPU clusters; selects NCCL)."""
    object_store_mb: int | None = None
    """Object store size of a local instance; None: sized from the model (twice the learner's
    weights, at least 256 MB). A size below what ``inference.weight_sync`` passes through it
    (the weights, with ``object_store`` or ``state_dict``) is refused before anything starts."""
    connect_timeout_s: float = 30.0
    """With ``ray.address``: how long to wait for the cluster's head to accept a connection
    before failing with what to check (Ray itself would retry for minutes)."""
    placement_strategy: PlacementStrategy = "PACK"
    """How the run's placement group (one bundle per learner rank, server and rollout worker)
    lies on the nodes: ``PACK`` fills as few nodes as fit it (learner ranks together, each
    server beside its rollout workers), ``SPREAD`` spreads the bundles over the nodes where it
    can, ``STRICT_SPREAD`` puts every bundle on a different node."""
    placement_timeout_s: float = 120.0
    """How long to wait for the cluster to hold the placement group before the run fails with
    what it needs and what each node has free (a local instance is checked at once)."""
    actor_memory_mb: int | None = None
    """Memory each bundle reserves, in MB; None: estimated per kind from the model (a learner
    rank its weights, gradients and Adam state, a server its weights, a rollout worker 256 MB).
    0 reserves none."""
    max_restarts: int = 3
    """Restarts a run may make of its inference servers, and apart of its rollout workers,
    after they die (``kill -9``, a lost node); past it, or with 0, the next death ends the run.
    A learner rank's death is another matter: the run resumes from its last checkpoint by
    itself once (``trainer.resume=auto``) or stops with how to resume."""

    def __post_init__(self) -> None:
        check_numbers(self, "ray")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"ray.num_cpus={self.num_cpus}: must be at least 1")
        if self.actor_cpus < 0 or self.learner_gpus < 0:
            raise ConfigError("ray.actor_cpus and ray.learner_gpus must be 0 or more")
        if self.object_store_mb is not None and self.object_store_mb < 75:
            # Ray refuses less, with a traceback, after start-up
            raise ConfigError(f"ray.object_store_mb={self.object_store_mb}: at least 75")
