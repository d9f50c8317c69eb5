"""Where the training run's processes live: a local Ray instance or an existing cluster."""

from __future__ import annotations

from dataclasses import dataclass

from areal_agents.config_values import check_numbers
from areal_agents.errors import ConfigError

__all__ = ["RayConfig"]


@dataclass
class RayConfig:
    """Where processes run: a local Ray instance (default) or an existing cluster."""

    address: str | None = None
    """Attach to a running cluster (``HOST:PORT`` of the head's GCS, ``auto`` or
    ``ray://HOST:PORT``); None starts a local one bound to 127.0.0.1."""
    num_cpus: int | None = None
    """CPUs of the local instance (None: all of this machine's)."""
    actor_cpus: float = 0.0
    """CPUs Ray reserves per actor; 0 lets every process share the machine (small hosts)."""
    learner_gpus: float = 0.0
    """GPUs per learner rank (1 on GPU clusters; selects NCCL)."""
    object_store_mb: int = 256
    """Object store size of a local instance."""
    connect_timeout_s: float = 30.0
    """With ``ray.address``: how long to wait for the cluster's head to accept a connection
    before failing with what to check (Ray itself would retry for minutes)."""

    def __post_init__(self) -> None:
        check_numbers(self, "ray")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"ray.num_cpus={self.num_cpus}: must be at least 1")
        if self.actor_cpus < 0 or self.learner_gpus < 0:
            raise ConfigError("ray.actor_cpus and ray.learner_gpus must be 0 or more")
        if self.object_store_mb < 75:  # Ray refuses less, with a traceback, after start-up
            raise ConfigError(f"ray.object_store_mb={self.object_store_mb}: at least 75")
