"""Process plumbing for the training loop: Ray start-up, the run directory, Ray-side actors.

Kept out of ``loop.py`` so that the loop reads as the algorithm: wait for a batch, train, push
weights, record, checkpoint.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from areal_agents.config import dump_yaml, to_dict
from areal_agents.cpus import pin_process
from areal_agents.errors import ConfigError
from areal_agents.files import read_json
from areal_agents.trainers.checkpoint import CheckpointManager
from areal_agents.trainers.cluster import attach_ray, loopback_only
from areal_agents.trainers.config import EnvConfig, InferenceConfig, RayConfig, TrainConfig
from areal_agents.trainers.ray_reaper import RUN_ENV, RayReaper
from areal_agents.trainers.rollout_worker import RayBuffer, RolloutWorker, WorkerStats

__all__ = [
    "RolloutWorkerActor",
    "choose_run_dir",
    "daemons_in_their_own_process_group",
    "remote_class",
    "start_ray",
    "stop_ray",
    "stop_workers",
]

logger = logging.getLogger(__name__)

#: Keys that must match for a run directory to be resumed with a new command line.
_RESUME_KEYS = (
    ("env", "name"),
    ("env", "group_size"),
    ("algo", "name"),
    ("model", "name"),
    ("trainer", "groups_per_step"),
    ("trainer", "seed"),
    ("trainer", "mode"),
)


def remote_class(cls: type) -> Any:
    """``ray.remote(cls)``, typed loosely (Ray's stubs do not know actor method handles)."""
    import ray

    return ray.remote(cls)


def worker_env() -> dict[str, str]:
    """Environment variables every Ray process gets (offline, quiet, same cache)."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
        # glibc's per-thread arenas keep freed activation memory resident; two arenas keep the
        # learners' and workers' resident size close to what they use
        "MALLOC_ARENA_MAX": "2",
    }
    passed = (
        "AREAL_CACHE_DIR",
        "AREAL_SANDBOX_IMAGE",
        "AREAL_VLLM_PYTHON",
        "PYTHONPATH",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
    )
    for key in passed:
        if key in os.environ:
            env[key] = os.environ[key]
    return env


_reaper: RayReaper | None = None


def start_ray(cfg: RayConfig, object_store_mb: int | None = None) -> bool:
    """Start (or attach to) Ray; returns True when this call started it.

    ``object_store_mb``: the local instance's object store (default ``ray.object_store_mb``,
    256 MB when that is unset; the training loop sizes it from the model:
    :func:`~areal_agents.trainers.placement.object_store_mb`).

    Without ``ray.address`` a fresh local instance is started, always (``address="local"``:
    never a cluster that a stale record on the machine names), on loopback only (Ray
    otherwise registers, and binds, the machine's network address), with token
    authentication set explicitly (no warning), and watched by a
    :class:`~areal_agents.trainers.ray_reaper.RayReaper`, so that none of its processes
    outlives this one, even after ``kill -9``.
    """
    import ray

    global _reaper
    os.environ.update({k: v for k, v in worker_env().items() if k not in os.environ})
    # Ray runs its workers at nice 15 by default: the learners would starve next to the server
    os.environ.setdefault("RAY_worker_niceness", "0")
    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": worker_env()}
    if cfg.address:
        attach_ray(cfg, runtime_env)
        return True
    loopback_only()
    if _reaper is not None:  # a previous run of this process: its leftovers go now
        _reaper.sweep_now()
    _reaper = RayReaper.start()
    os.environ[RUN_ENV] = _reaper.token  # inherited by Ray's processes, not by later children
    # Ray enables token authentication for a new local cluster and warns that it did; it
    # stays enabled, the warning is not printed (RAY_AUTH_MODE=token would say the same, but
    # Ray reads it once per process, possibly before this function runs).
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    auth_level = auth_log.level
    auth_log.setLevel(logging.ERROR)
    try:
        with daemons_in_their_own_process_group():
            context = ray.init(
                address="local",
                num_cpus=cfg.num_cpus or os.cpu_count() or 1,
                num_gpus=None,
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                object_store_memory=(object_store_mb or cfg.object_store_mb or 256) * 2**20,
                runtime_env=runtime_env,
                logging_level=logging.WARNING,
                log_to_driver=True,
            )
    except BaseException:
        _reaper.sweep_now()
        _reaper = None
        raise
    finally:
        os.environ.pop(RUN_ENV, None)
        auth_log.setLevel(auth_level)
    session_dir = (getattr(context, "address_info", None) or {}).get("session_dir")
    if session_dir:
        _reaper.watch(str(session_dir))
    atexit.register(_reaper.close)
    return True


@contextlib.contextmanager
def daemons_in_their_own_process_group() -> Iterator[None]:
    """While inside, the processes ``ray.init`` starts (GCS, raylet, and through the raylet its
    agents) lead a process group of their own instead of joining the driver's.

    Ray already keeps its workers out of the driver's process group, and blocks SIGINT in its
    daemons, but not SIGTERM: ``kill -TERM -PGID`` (what ``timeout``, process supervisors and
    the test of a graceful stop send) reached the raylet, whose shutdown took the learners
    with it in the middle of the step the driver meant to finish and checkpoint. The daemons
    still die with the driver (Ray's parent-death signal, and the run's
    :class:`~areal_agents.trainers.ray_reaper.RayReaper`) and on :func:`stop_ray`.
    """
    from ray._private import services

    popen = services.ConsolePopen

    class _OwnGroupPopen(popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = _OwnGroupPopen  # type: ignore[misc]
    try:
        yield
    finally:
        services.ConsolePopen = popen  # type: ignore[misc]


def stop_ray() -> None:
    """``ray.shutdown()``, then reap what the local run left (its agents) at once."""
    import ray

    global _reaper
    ray.shutdown()
    if _reaper is not None:
        _reaper.sweep_now()
        _reaper = None


def _finished(run_dir: Path, total_steps: int) -> bool:
    summary = run_dir / "summary.json"
    return summary.is_file() and int(read_json(summary).get("steps", 0)) >= total_steps


def choose_run_dir(cfg: TrainConfig) -> tuple[Path, Path | None]:
    """The run directory and the checkpoint to resume from (None: start fresh).

    With the default ``output_dir``, a directory whose run has finished is left alone and the
    next free ``-2``, ``-3``... is used; an unfinished run is resumed, so re-running a killed
    command continues it. An explicit ``output_dir`` is always used (and resumed if it can be).
    """
    base = cfg.run_dir()
    total = cfg.trainer.total_steps
    run_dir = base
    if not cfg.output_dir:
        for i in range(1, 10_000):
            run_dir = base if i == 1 else base.with_name(f"{base.name}-{i}")
            if not _finished(run_dir, total):
                break
    ckpt = CheckpointManager(run_dir / "checkpoints", create=False).latest()
    if ckpt is None:
        return run_dir, None
    if cfg.trainer.resume == "never":
        raise ConfigError(
            f"{run_dir} already holds a run (checkpoint {ckpt.name}); with trainer.resume=never "
            "choose a new output_dir=PATH or delete that directory"
        )
    saved_path = run_dir / "config.yaml"
    if saved_path.is_file():
        import yaml

        saved = yaml.safe_load(saved_path.read_text()) or {}
        now = to_dict(cfg)
        for section, key in _RESUME_KEYS:
            old, new = saved.get(section, {}).get(key), now[section][key]
            if old != new:
                raise ConfigError(
                    f"{run_dir} holds a run with {section}.{key}={old!r}, this command has "
                    f"{new!r}: a run cannot resume with a different {section}.{key}; use "
                    f"output_dir=PATH for a new run (or {section}.{key}={old!r} to resume)"
                )
    return run_dir, ckpt


def save_config(cfg: TrainConfig, run_dir: Path) -> None:
    dump_yaml(cfg, run_dir / "config.yaml")


class RolloutWorkerActor:
    """A :class:`RolloutWorker` inside a Ray actor, talking to the buffer actor and servers."""

    def __init__(
        self,
        env: EnvConfig,
        inference: InferenceConfig,
        base_urls: list[str],
        model_dir: str,
        served_name: str,
        buffer: Any,
        worker_id: int,
        max_concurrent_groups: int,
        exclude_task_ids: frozenset[str] = frozenset(),
        chat_template: str | None = None,
        incarnation: int = 0,
    ) -> None:
        from transformers import AutoTokenizer

        from areal_agents.trainers.modeling import node_model_dir

        pin_process(inference.cpus)  # the generation side's cores (inference.cpus)
        # the template applied on this node: the driver's run directory is not readable here
        self.tokenizer = AutoTokenizer.from_pretrained(
            str(node_model_dir(model_dir, chat_template))
        )
        self.inference = inference
        self.served_name = served_name
        self.worker = RolloutWorker(
            env,
            self._policies(base_urls),
            RayBuffer(buffer),
            max_concurrent_groups=max_concurrent_groups,
            worker_id=worker_id,
            exclude_task_ids=exclude_task_ids,
            incarnation=incarnation,
        )

    def _policies(self, base_urls: list[str]) -> list[Any]:
        """One token-level policy per server URL."""
        from areal_agents.policies.token_client import TokenPolicy
        from areal_agents.serving.engines import get_engine

        inference, engine = self.inference, get_engine(self.inference.engine)
        return [
            TokenPolicy(
                url,
                self.served_name,
                self.tokenizer,
                max_tokens=inference.max_tokens,
                temperature=inference.temperature,
                top_p=inference.top_p,
                timeout=inference.request_timeout_s,
                version_source=engine.version_source(url),
            )
            for url in base_urls
        ]

    async def run(self) -> WorkerStats:
        return await self.worker.run()

    async def stop(self) -> None:
        self.worker.stop()

    async def pause(self) -> list[int]:
        """:meth:`RolloutWorker.pause`: the tasks in flight go back to the buffer."""
        return await self.worker.pause()

    async def resume(self, base_urls: list[str]) -> None:
        """:meth:`RolloutWorker.resume` on the servers at ``base_urls``."""
        old = self.worker.policies
        self.worker.resume(self._policies(base_urls))
        for policy in old:  # their connections went to the servers of before
            close = getattr(policy, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    async def stats(self) -> WorkerStats:
        return self.worker.stats


def stop_workers(workers: list[Any], runs: list[Any]) -> None:
    """Ask the rollout workers to stop and wait (briefly) until they have."""
    import ray

    try:
        ray.get([w.stop.remote() for w in workers], timeout=10)
        ray.wait(runs, num_returns=len(runs), timeout=60)
    except Exception:
        logger.debug("stopping the rollout workers failed", exc_info=True)
