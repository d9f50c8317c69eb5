"""The learner's weights and checkpoints: what leaves a rank (the full state for the servers,
the LoRA adapter, vLLM's weight transfer) and what a checkpoint holds (model, optimizer,
scheduler, critic, running baseline, the probe's positions, the KL brake's scale, RNG).

:class:`LearnerState` is the part of :class:`~areal_agents.trainers.learner.Learner` that moves
state in and out; the learner sets the attributes it declares in ``setup``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from areal_agents.errors import ConfigError
from areal_agents.trainers import fsdp
from areal_agents.trainers.advantages import RunningBaseline
from areal_agents.trainers.checkpoint import capture_rng, read_files, restore_rng, write_files
from areal_agents.trainers.lora import adapter_state, merged_state
from areal_agents.trainers.model_config import LoraConfig
from areal_agents.trainers.probe import KLBrake, PolicyProbe

__all__ = ["LearnerState"]


def _lora_shape(lora: LoraConfig | None) -> dict[str, Any] | None:
    """What a checkpoint's adapter depends on (None: full fine-tuning)."""
    if lora is None:
        return None
    return {"r": lora.r, "alpha": lora.alpha, "target_modules": sorted(lora.target_modules)}


class LearnerState:
    """Weights out, checkpoints in and out, for one learner rank (every method collective)."""

    spec: Any  # LearnerSpec
    step: int
    model: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    critic: Any
    critic_optimizer: torch.optim.Optimizer
    lora: LoraConfig | None
    config: Any
    baseline: RunningBaseline | None
    probe: PolicyProbe
    brake: KLBrake
    transfer: Any

    # ---- weights and checkpoints -----------------------------------------------------------

    def full_state(self) -> dict[str, Any]:
        """The policy's full state dict on rank 0 (``{}`` on others), under the base model's
        names (with LoRA: adapters merged in). Collective."""
        state = fsdp.full_model_state(self.model)
        if self.lora is None or not state:
            return state
        return merged_state(state, self.lora.scaling)

    def adapter_state(self) -> dict[str, Any]:
        """The LoRA adapter (PEFT names, whole tensors on every rank): what a push sends.
        Collective."""
        return adapter_state(self.model)

    def full_state_arrays(self) -> dict[str, Any]:
        """:meth:`full_state` as numpy arrays, for Ray's object store
        (:func:`areal_agents.trainers.object_store.to_arrays`). Collective."""
        from areal_agents.trainers.object_store import to_arrays

        return to_arrays(self.full_state())

    def export_weights(self, directory: str) -> None:
        """Write the policy as a Hugging Face directory (rank 0) for the inference servers.
        Collective: every rank must call it."""
        from safetensors.torch import save_file

        state = self.full_state()
        if self.spec.rank != 0:
            return
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        if getattr(self.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        tensors = {k: v.detach().contiguous() for k, v in state.items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        self.config.save_pretrained(str(out))

    def weight_files(self) -> dict[str, bytes]:
        """:meth:`export_weights` through this node's temporary directory: the files rank 0
        wrote (``{}`` on others), for the driver to store. Collective."""
        with tempfile.TemporaryDirectory(prefix="areal-weights-") as tmp:
            self.export_weights(tmp)
            return read_files(tmp) if self.spec.rank == 0 else {}

    def init_vllm_transfer(self, **kwargs: Any) -> None:
        """Join vLLM's weight transfer (``inference.weight_sync=nccl|ipc``): see
        :func:`~areal_agents.serving.vllm_transfer.module_transfer` for ``kwargs``. Collective."""
        from areal_agents.serving.vllm_transfer import module_transfer

        self.transfer = module_transfer(self.model, rank=self.spec.rank, **kwargs)

    def send_vllm_weights(self, version: int) -> None:
        """Send the policy to the vLLM servers as ``version``. Collective."""
        self.transfer.send(version)

    def save_checkpoint(self, directory: str) -> None:
        """Model, optimizer, scheduler, critic, running baseline and RNG into ``directory``.
        Collective."""
        out = Path(directory)
        state: dict[str, Any] = {
            # with LoRA only the adapters: the base is the model directory
            "model": fsdp.full_model_state(self.model, trainable_only=self.lora is not None),
            "optimizer": fsdp.full_optimizer_state(self.model, self.optimizer),
        }
        if self.critic is not None:
            state["critic"] = fsdp.full_model_state(self.critic)
            state["critic_optimizer"] = fsdp.full_optimizer_state(
                self.critic, self.critic_optimizer
            )
        if self.spec.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            torch.save(state, out / "learner.pt")
            schedule = {
                "scheduler": self.scheduler.state_dict(),
                "step": self.step,
                "lora": _lora_shape(self.lora),
            }
            if self.baseline is not None:
                schedule["baseline"] = self.baseline.state_dict()
            schedule["probe"] = self.probe.state_dict()
            schedule["brake"] = self.brake.state_dict()
            torch.save(schedule, out / "schedule.pt")
        dist.barrier()
        torch.save(capture_rng(), out / f"rng_rank{self.spec.rank}.pt")

    def load_checkpoint(self, directory: str) -> int:
        """Undo :meth:`save_checkpoint` (any number of ranks may load it). Collective."""
        src = Path(directory)
        schedule = torch.load(src / "schedule.pt", map_location="cpu", weights_only=False)
        saved, now = schedule.get("lora"), _lora_shape(self.lora)
        if saved != now:  # checked on every rank, before any collective
            raise ConfigError(
                f"the checkpoint in {src} was trained with model.lora={saved}, this run has "
                f"model.lora={now}: resume with the same model.lora keys"
            )
        state: dict[str, Any] = {}
        if self.spec.rank == 0:
            state = torch.load(src / "learner.pt", map_location="cpu", weights_only=False)
        # a finished run's last checkpoint keeps no optimizer state (trainers/warm_start.py)
        with_opt = schedule.get("optimizer", True) is not False
        fsdp.load_full_state(
            self.model,
            self.optimizer if with_opt else None,
            state.get("model", {}),
            state.get("optimizer", {}) if with_opt else None,
            trainable_only=self.lora is not None,
        )
        if self.critic is not None:
            fsdp.load_full_state(
                self.critic,
                self.critic_optimizer if with_opt else None,
                state.get("critic", {}),
                state.get("critic_optimizer", {}) if with_opt else None,
            )
        self.scheduler.load_state_dict(schedule["scheduler"])
        self.step = int(schedule["step"])
        if self.baseline is not None and "baseline" in schedule:
            self.baseline.load_state_dict(schedule["baseline"])
        self.probe.load_state_dict(schedule.get("probe") or {})
        self.brake.load_state_dict(schedule.get("brake") or {})
        rng = src / f"rng_rank{self.spec.rank}.pt"
        if rng.is_file():
            restore_rng(torch.load(rng, weights_only=False))
        return self.step

    def checkpoint_files(self) -> dict[str, bytes]:
        """:meth:`save_checkpoint` through this node's temporary directory; the files this rank
        wrote, for the driver to store. Collective."""
        with tempfile.TemporaryDirectory(prefix="areal-ckpt-") as tmp:
            self.save_checkpoint(tmp)
            return read_files(tmp)

    def load_checkpoint_files(self, files: dict[str, bytes]) -> int:
        """:meth:`load_checkpoint` from the driver's files (every rank's). Collective."""
        with tempfile.TemporaryDirectory(prefix="areal-ckpt-") as tmp:
            return self.load_checkpoint(str(write_files(files, tmp)))
