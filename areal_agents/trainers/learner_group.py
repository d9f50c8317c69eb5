"""The learner ranks as Ray actors: placement, rendezvous, and calls on every rank at once.

A collective call waits on every rank and fails as soon as one rank is gone
(:func:`gather`): the others would wait in the collective for their peer until the process
group's timeout. The loss is :class:`~areal_agents.errors.LearnerLost`; the loop goes back to
its last checkpoint (``trainers/loop.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from areal_agents.errors import LearnerLost
from areal_agents.trainers.checkpoint import read_files, write_files
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.learner import Learner, LearnerSpec
from areal_agents.trainers.placement import Placement, run_bundles, weights_mb
from areal_agents.trainers.replay import ReplayRow
from areal_agents.trainers.runtime import remote_class
from areal_agents.types import Trajectory

__all__ = ["LearnerGroup", "gather"]


def gather(refs: list[Any], what: str = "learner rank") -> list[Any]:
    """``ray.get(refs)``, raising :class:`LearnerLost` as soon as one of them is from a dead
    actor (not after the others, which may wait for it forever)."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except ray.exceptions.RayActorError as e:
            rank = refs.index(done[0])
            raise LearnerLost(f"{what} {rank} died: {type(e).__name__}: {e}") from None
    return list(ray.get(refs))


class LearnerGroup:
    """``trainer.learner_ranks`` FSDP2 ranks, each a Ray actor in its bundle of the run's
    placement group (``ray.actor_cpus`` CPUs, ``ray.learner_gpus`` GPUs each).

    Every collective method (train, export, checkpoint) is called on all ranks together; the
    result of rank 0 is returned. Without ``placement`` (a group used on its own, outside a
    run) it reserves a placement group of its own for the ranks, given back at
    :meth:`shutdown`.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model_dir: Path,
        placement: Placement | None = None,
        replay: Sequence[ReplayRow] = (),
    ) -> None:
        world = cfg.trainer.learner_ranks
        self._own_placement: Placement | None = None
        if placement is None:
            bundles = run_bundles(cfg, weights_mb(model_dir, cfg.model.dtype))
            placement = self._own_placement = Placement.reserve(
                [b for b in bundles if b.kind == "learner"],
                cfg.ray.placement_strategy,
                cfg.ray.placement_timeout_s,
                on_cluster=bool(cfg.ray.address),
            )
        use_gpu = cfg.ray.learner_gpus > 0
        self.on_cluster = bool(cfg.ray.address)
        self.lost = False
        actor = remote_class(Learner)
        self.actors = [
            actor.options(
                name=None,
                max_concurrency=1,
                **placement.options("learner", rank),
            ).remote(
                spec=LearnerSpec(
                    model_dir=str(model_dir),
                    algo=cfg.algo.for_mode(cfg.trainer.mode),  # loss=auto resolved
                    trainer=cfg.trainer,
                    model=cfg.model,
                    temperature=cfg.inference.temperature,
                    rank=rank,
                    world_size=world,
                    use_gpu=use_gpu,
                    max_response_tokens=cfg.inference.max_tokens,
                    replay=tuple(replay),
                    replay_batch=cfg.warm_start.batch_size,
                )
            )
            for rank in range(world)
        ]
        address = ray.get(self.actors[0].address.remote())
        port = ray.get(self.actors[0].free_port.remote())
        self.info = self._all("setup", master_addr=address, master_port=port)

    def _all(self, method: str, **kwargs: Any) -> Any:
        try:
            return gather([getattr(a, method).remote(**kwargs) for a in self.actors])[0]
        except LearnerLost:
            self.lost = True
            raise

    def train_step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        ref = ray.put(trajectories)  # one copy in the object store for every rank
        return dict(self._all("train_step", trajectories=ref))

    def export_weights(self, directory: Path) -> None:
        """The policy as a Hugging Face directory, written by rank 0 on its own node (what the
        disk weight sync gives servers that share that disk)."""
        self._all("export_weights", directory=str(directory))

    def export_weights_to_driver(self, directory: Path) -> None:
        """:meth:`export_weights` into ``directory`` on the driver's disk: on a cluster rank 0
        sends its files here (its node need not share the run directory)."""
        if not self.on_cluster:
            self.export_weights(directory)
            return
        self._files_to_driver("weight_files", directory)

    def _files_to_driver(self, method: str, directory: Path) -> None:
        """Every rank's files from ``method`` (a ``*_files`` collective) into ``directory``."""
        try:
            parts = gather([getattr(a, method).remote() for a in self.actors])
        except LearnerLost:
            self.lost = True
            raise
        write_files({name: data for part in parts for name, data in part.items()}, directory)

    def full_state(self) -> dict[str, Any]:
        return dict(self._all("full_state"))

    def adapter_state(self) -> dict[str, Any]:
        """The LoRA adapter (PEFT names): what a push sends with ``model.lora.r > 0``."""
        return dict(self._all("adapter_state"))

    def state_ref(self) -> Any:
        """Rank 0's full state dict, left in Ray's object store as numpy arrays: its
        ``ObjectRef`` (see :mod:`areal_agents.trainers.object_store`)."""
        refs = [a.full_state_arrays.remote() for a in self.actors]
        try:
            gather(refs[1:])  # the other ranks take part in the gather and return {}
        except LearnerLost:
            self.lost = True
            raise
        ray.wait(refs[:1], fetch_local=False)
        ray.wait(refs[:1], fetch_local=False)
        return refs[0]

    def init_vllm_transfer(
        self, backend: str, base_urls: list[str], timeout_s: float, bucket_bytes: int
    ) -> None:
        """Every rank joins vLLM's weight transfer; rank 0 (the sender) meets the servers at
        its own address."""
        address = ray.get(self.actors[0].address.remote())
        port = ray.get(self.actors[0].free_port.remote())
        self._all(
            "init_vllm_transfer",
            backend=backend,
            base_urls=base_urls,
            timeout_s=timeout_s,
            bucket_bytes=bucket_bytes,
            master_address=address,
            master_port=port,
        )

    def send_vllm_weights(self, version: int) -> None:
        """The policy to every vLLM server as ``version``, from the ranks that hold it."""
        self._all("send_vllm_weights", version=version)

    def save_checkpoint(self, directory: Path) -> None:
        """The learner part of a checkpoint into ``directory`` on the driver's disk: on a
        cluster the ranks send their files here (nothing on another node needs the run
        directory); locally they write it themselves."""
        if not self.on_cluster:
            self._all("save_checkpoint", directory=str(directory))
            return
        self._files_to_driver("checkpoint_files", directory)

    def load_checkpoint(self, directory: Path) -> int:
        if not self.on_cluster:
            return int(self._all("load_checkpoint", directory=str(directory)))
        files = ray.put(read_files(directory))  # one copy in the object store for every rank
        return int(self._all("load_checkpoint_files", files=files))

    def shutdown(self) -> None:
        # the process group may already be gone; killing the actors follows anyway (at once
        # after a loss: the ranks left wait in a collective for the dead one)
        if not self.lost:
            with contextlib.suppress(Exception):
                ray.get([a.shutdown.remote() for a in self.actors], timeout=30)
        for a in self.actors:
            ray.kill(a)
        if self._own_placement is not None:
            self._own_placement.remove()
