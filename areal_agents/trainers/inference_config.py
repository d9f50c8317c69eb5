"""``inference.*``: the inference servers that generate rollouts and receive new weights.

A section of :class:`~areal_agents.trainers.config.TrainConfig` (re-exported there), kept in its
own module for its size: the engine, the servers, sampling, and how weights reach them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from areal_agents.config_values import check_numbers
from areal_agents.errors import ConfigError
from areal_agents.serving.engines import ENGINES, get_engine

__all__ = ["InferenceConfig"]


@dataclass
class InferenceConfig:
    """The inference servers that generate rollouts and receive new weights."""

    engine: str = "builtin"
    """``builtin`` (transformers, starts in seconds) or ``vllm`` (stock vLLM server); any
    engine in ``areal_agents.serving.engines``."""
    num_servers: int = 1
    """Inference servers; rollout workers spread their requests over them."""
    max_tokens: int = 64
    """New tokens per assistant turn."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts. The learner computes its log-probs at the same
    temperature, and the servers a run starts report the behaviour log-probs of the tempered
    distribution (``--logprobs-mode processed_logprobs``), so importance weights compare like
    with like at any temperature."""
    top_p: float = 1.0
    """Nucleus sampling (1.0: off, as on-policy RL expects)."""
    request_timeout_s: float = 600.0
    """Time limit of one generation request."""
    startup_timeout_s: float = 600.0
    """Time a server may take to answer its health check."""
    weight_sync: Literal["auto", "disk", "state_dict", "object_store", "nccl", "ipc"] = "auto"
    """How weights travel: ``disk`` (a safetensors checkpoint under the run directory: needs a
    disk the servers share), ``state_dict`` (tensors in an HTTP body), ``object_store`` (Ray's
    object store, then a safetensors file in the server node's shared memory that the server
    loads from; no shared disk, any engine), ``nccl`` (vLLM on GPUs: vLLM's own weight
    transfer, a broadcast from learner rank 0 to every server; no shared disk), ``ipc`` (vLLM
    on the learner's GPU: CUDA IPC handles) or ``auto`` (``disk`` on a local run,
    ``object_store`` attached to a cluster)."""
    weight_sync_timeout_s: float = 300.0
    """Time limit of one weight push; beyond it the run fails with WeightSyncError."""
    weight_bucket_mb: float = 256.0
    """``weight_sync=nccl|ipc``: tensors travel packed in buckets of this many MiB."""
    gpus_per_server: float = 0.0
    """GPUs Ray reserves for each server (0 on CPU machines)."""
    extra_args: tuple[str, ...] = ()
    """Extra command-line arguments for the server process."""
    torch_threads: int | None = None
    """Torch (OpenMP/MKL) threads of each built-in server process the trainer starts (set as
    ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in its environment); None leaves the inherited
    setting (torch takes at most as many as the cores it sees from these variables). vLLM's
    CPU threads are set by its own ``VLLM_CPU_OMP_THREADS_BIND`` instead."""
    cpus: tuple[int, ...] | None = None
    """CPU cores the generation side runs on (Linux): each server the trainer starts, with all
    its processes (vLLM's CPU build also binds its OpenMP threads to them), and the rollout
    workers. None: every core. Split a CPU machine with ``trainer.learner_cpus``, e.g.
    ``inference.cpus=[1] trainer.learner_cpus=[0]`` (``areal_agents/cpus.py`` says why)."""

    def resolved_weight_sync(self, on_cluster: bool) -> str:
        """``weight_sync`` with ``auto`` resolved for a local run or a cluster (where a server
        need not share the driver's disk)."""
        if self.weight_sync != "auto":
            return self.weight_sync
        return "object_store" if on_cluster else "disk"

    def __post_init__(self) -> None:
        check_numbers(self, "inference")
        engine = get_engine(self.engine)
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ConfigError(
                f"inference.torch_threads={self.torch_threads}: must be at least 1 "
                "(or null to keep the inherited setting)"
            )
        if self.torch_threads is not None and engine.torch_threads_note is not None:
            raise ConfigError(
                f"inference.torch_threads does not apply to inference.engine={self.engine}: "
                f"{engine.torch_threads_note} (leave inference.torch_threads out: choosing the "
                "engine leaves the defaults' value unset)"
            )
        if self.weight_sync in ("nccl", "ipc") and self.engine != "vllm":
            raise ConfigError(
                f"inference.weight_sync={self.weight_sync} is vLLM's weight transfer: it needs "
                f"inference.engine=vllm (got {self.engine}); use weight_sync=state_dict or "
                "object_store with the built-in server"
            )
        if self.num_servers < 1:
            raise ConfigError(f"inference.num_servers={self.num_servers}: must be at least 1")
        if self.weight_bucket_mb <= 0:
            raise ConfigError(f"inference.weight_bucket_mb={self.weight_bucket_mb}: must be > 0")
        if self.max_tokens < 1:
            raise ConfigError(f"inference.max_tokens={self.max_tokens}: must be at least 1")
        if self.temperature <= 0:
            raise ConfigError(
                f"inference.temperature={self.temperature}: RL needs sampling; use a value > 0"
            )
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"inference.top_p={self.top_p}: must be in (0, 1]")

    #: ``inference.engine=NAME`` chooses the ``inference`` group's option ``NAME``
    #: (:meth:`with_preset`), as ``inference=NAME`` does.
    PRESET_KEY: ClassVar[str] = "engine"

    @classmethod
    def from_name(cls, name: str) -> InferenceConfig:
        """``inference=builtin|vllm`` (any registered engine) on this dataclass's defaults."""
        return cls(engine=get_engine(name).name)

    def with_preset(self, name: str) -> tuple[InferenceConfig, dict[str, str]]:
        """This section moved to the engine ``name``: what ``inference=NAME`` and
        ``inference.engine=NAME`` give on top of a recipe (the trainer's defaults).

        Every value the engine takes is kept (the recipe's ``max_tokens=80`` stays 80); one it
        cannot take is reset, and the returned notes (key -> why) say so: vLLM takes its CPU
        threads from ``VLLM_CPU_OMP_THREADS_BIND``, so ``torch_threads`` is left unset.

        >>> cfg, notes = InferenceConfig(max_tokens=80, torch_threads=1).with_preset("vllm")
        >>> cfg.engine, cfg.max_tokens, cfg.torch_threads, list(notes)
        ('vllm', 80, None, ['torch_threads'])
        """
        engine = get_engine(name)
        moved = replace(self, engine=engine.name, torch_threads=None)  # checked without it first
        notes: dict[str, str] = {}
        if self.torch_threads is not None and engine.torch_threads_note is not None:
            notes["torch_threads"] = (
                f"inference.engine={engine.name}: inference.torch_threads={self.torch_threads} "
                f"of the defaults left unset ({engine.torch_threads_note})"
            )
        else:
            moved = replace(moved, torch_threads=self.torch_threads)
        return moved, notes

    @classmethod
    def preset_names(cls) -> tuple[str, ...]:
        """The ``inference`` config group's options: the registered engines."""
        return tuple(ENGINES)
