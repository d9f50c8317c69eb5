"""The training loop's helpers: checks before the start, the rollout workers, the batch wait,
checkpoints, the end.

Kept apart from ``loop.py`` so that :func:`~areal_agents.trainers.loop.train` reads as the
algorithm; each helper is named there where it is used.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray

from areal_agents.cpus import check_cpus
from areal_agents.envs.registry import make_env
from areal_agents.files import write_json
from areal_agents.trainers.buffer import Group
from areal_agents.trainers.checkpoint import CheckpointManager, save_rng
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.curriculum import EnvFamilies
from areal_agents.trainers.inference import server_alive, stop_servers
from areal_agents.trainers.learner_group import LearnerGroup
from areal_agents.trainers.placement import Placement
from areal_agents.trainers.runtime import (
    RolloutWorkerActor,
    remote_class,
    stop_ray,
    stop_workers,
)
from areal_agents.trainers.step_records import waiting_postfix
from areal_agents.trainers.stop import GracefulStop, over
from areal_agents.trainers.supervisor import Supervisor
from areal_agents.trainers.weight_sync import WeightSync

__all__ = [
    "buffer_options",
    "check_env",
    "checkpoint_due",
    "make_sync",
    "reserve",
    "save_checkpoint",
    "shutdown",
    "start_workers",
    "wait_for_batch",
]


def check_env(cfg: TrainConfig) -> None:
    """Build the environment once so that a bad name or argument fails before anything starts;
    on a local run, check the CPU placement against this machine's cores."""
    env = make_env(cfg.env.name, **cfg.env.make_kwargs())
    env.close()
    if not cfg.ray.address:  # on a cluster the cores are those of other machines
        check_cpus(cfg.trainer.learner_cpus, "trainer.learner_cpus")
        check_cpus(cfg.inference.cpus, "inference.cpus")


def buffer_options(cfg: TrainConfig, held_out: frozenset[str] | None = None) -> dict[str, Any]:
    """The :class:`TrajectoryBuffer` the run's config asks for, as keyword arguments
    (``held_out``: the task ids the rollout workers keep out of training)."""
    return {
        "groups_per_step": cfg.trainer.groups_per_step,
        "max_staleness": cfg.trainer.effective_max_staleness,
        "data_seed": cfg.trainer.seed,
        "dynamic_sampling": cfg.algo.dynamic_sampling,
        "batch_order": cfg.trainer.batch_order,
        # nothing is admitted that the run would never train (the last steps drain the rest)
        "total_groups": cfg.trainer.total_steps * cfg.trainer.groups_per_step,
        "task_families": task_families(cfg, held_out),
    }


def task_families(cfg: TrainConfig, held_out: frozenset[str] | None = None) -> EnvFamilies | None:
    """What ``algo.task_sampling=learnability`` rates tasks by (None for ``uniform``), tried on
    one seed here, so that an environment that cannot name its tasks before a reset fails now
    with a :class:`~areal_agents.errors.ConfigError`, not in the buffer's process.
    ``held_out``: the task ids the workers replace (a seed is rated under the task played)."""
    if cfg.algo.task_sampling != "learnability":
        return None
    families = EnvFamilies(cfg.env.name, dict(cfg.env.make_kwargs()), held_out or frozenset())
    try:
        families(cfg.trainer.seed)
    finally:
        families.close()
    return families


def checkpoint_due(step: int, cfg: TrainConfig, since_last_s: float = 0.0) -> bool:
    """Whether step ``step`` is checkpointed: every ``trainer.checkpoint_every`` steps (0:
    not by count), once ``trainer.checkpoint_interval_s`` seconds have passed since the last
    checkpoint (``since_last_s``), and always the last one."""
    every, interval = cfg.trainer.checkpoint_every, cfg.trainer.checkpoint_interval_s
    by_time = interval is not None and since_last_s >= interval
    return bool(every and step % every == 0) or by_time or step == cfg.trainer.total_steps


def make_sync(cfg: TrainConfig, servers: list[Any], run_dir: Path) -> WeightSync:
    """How the learners' weights reach the servers (``<run>/weights`` on a local run)."""
    return WeightSync(
        cfg.inference,
        servers,
        run_dir / "weights",
        lora=cfg.model.lora,
        on_cluster=bool(cfg.ray.address),
        alive=server_alive,
    )


def reserve(cfg: TrainConfig, bundles: list[Any]) -> Placement:
    """The run's placement group, held by the cluster within ``ray.placement_timeout_s``
    (saying every 10 s what it waits for), else :class:`~areal_agents.errors.CapacityError`."""
    said = [0.0]

    def waiting(seconds: float) -> None:
        if seconds - said[0] >= 10:
            said[0] = seconds
            print(
                f"waiting for the cluster to hold the run's {len(bundles)} bundles "
                f"({seconds:.0f} s of ray.placement_timeout_s={cfg.ray.placement_timeout_s:g})",
                flush=True,
            )

    return Placement.reserve(
        bundles,
        cfg.ray.placement_strategy,
        cfg.ray.placement_timeout_s if cfg.ray.address else min(cfg.ray.placement_timeout_s, 30),
        on_cluster=bool(cfg.ray.address),
        on_wait=waiting,
    )


def wait_for_batch(
    buffer: Any,
    supervisor: Supervisor,
    bar: Any,
    deadline: float | None = None,
    stop: GracefulStop | None = None,
    poll_s: float = 0.2,
) -> list[Group] | None:
    """The next batch, or None once ``deadline`` has passed or a stop was requested (no batch
    is taken after it); fails fast when the supervision failed (a death it could not restart,
    a rollout worker's own error) instead of waiting forever."""
    polls = 0
    while True:
        if over(deadline) or (stop is not None and stop.requested):
            return None
        batch = ray.get(buffer.pop_batch.remote())
        if batch is not None:
            return list(batch)
        supervisor.raise_if_failed()
        polls += 1
        if polls % 25 == 0:  # show that generation is moving while the learner waits
            bar.set_postfix_str(waiting_postfix(ray.get(buffer.stats.remote())))
        time.sleep(poll_s)


def save_checkpoint(
    ckpt: CheckpointManager, step: int, learners: LearnerGroup, buffer: Any, elapsed_s: float
) -> Path:
    """Model, optimizer, scheduler, buffer (cursor, in-flight, ready groups), RNG: atomically."""
    tmp = ckpt.begin(step)
    learners.save_checkpoint(tmp / "learner")
    write_json(tmp / "buffer.json", ray.get(buffer.state_dict.remote()))
    save_rng(tmp / "rng.pkl")
    write_json(tmp / "trainer.json", {"step": step, "version": step, "elapsed_s": elapsed_s})
    return ckpt.commit(tmp, step)


def shutdown(
    workers: list[Any],
    runs: list[Any],
    learners: LearnerGroup | None,
    servers: list[Any],
    started_ray: bool,
    placement: Placement | None = None,
) -> None:
    """Stop everything this run started, in reverse order; best effort."""
    stop_workers(workers, runs)  # workers close their environments (and sandboxes) on return
    for w in workers:
        ray.kill(w)
    if learners is not None:
        learners.shutdown()
    stop_servers(servers)
    if placement is not None:
        placement.remove()
    if started_ray:
        stop_ray()


def start_workers(
    cfg: TrainConfig,
    servers: list[Any],
    model_dir: Path,
    buffer: Any,
    exclude_task_ids: frozenset[str] = frozenset(),
    chat_template: str | None = None,
    model: str = "policy",
    placement: Placement | None = None,
    only: tuple[int, int, list[str]] | None = None,
) -> list[Any]:
    """The rollout workers (Ray actors, each in its bundle of ``placement``) on ``servers``;
    each applies ``chat_template`` on its own node. ``only=(index, incarnation, urls)``: that
    one worker, on the servers at ``urls`` (a restart)."""
    urls = [str(s.base_url) for s in servers]
    todo = [only] if only else [(i, 0, urls) for i in range(cfg.trainer.rollout_workers)]
    actor = remote_class(RolloutWorkerActor)
    return [
        actor.options(
            max_concurrency=16,
            **(placement.options("rollout_worker", i) if placement else {}),
        ).remote(
            env=cfg.env,
            inference=cfg.inference,
            base_urls=worker_urls,
            model_dir=str(model_dir),
            served_name=model,
            buffer=buffer,
            worker_id=i,
            max_concurrent_groups=cfg.trainer.concurrent_groups,
            exclude_task_ids=exclude_task_ids,
            chat_template=chat_template,
            incarnation=incarnation,
        )
        for i, incarnation, worker_urls in todo
    ]
