"""The ``model`` section of the training configuration: the policy model that is trained and
served, its dtypes and chat template, and its LoRA adapters (``model=NAME`` selects a preset or
a model directory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from areal_agents.config_values import check_numbers
from areal_agents.errors import ConfigError

__all__ = ["LoraConfig", "ModelConfig"]


@dataclass
class LoraConfig:
    """LoRA: train low-rank adapters on some linear layers instead of every weight."""

    r: int = 0
    """Adapter rank (0: LoRA off, full fine-tuning)."""
    alpha: float = 16.0
    """Scaling numerator: the update is ``B @ A * alpha / r``."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0 keeps log-probs reproducible)."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Names of the linear layers that get an adapter (matched on the last name component)."""

    def __post_init__(self) -> None:
        check_numbers(self, "model.lora")
        if self.r < 0:
            raise ConfigError(f"model.lora.r={self.r}: must be 0 (off) or a positive rank")
        if self.r > 0 and self.alpha <= 0:
            raise ConfigError(f"model.lora.alpha={self.alpha}: must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout={self.dropout}: must be in [0, 1)")
        if self.r > 0 and not self.target_modules:
            raise ConfigError(
                "model.lora.target_modules is empty: name the linear layers to adapt, "
                "e.g. model.lora.target_modules=[q_proj,v_proj]"
            )

    @property
    def enabled(self) -> bool:
        """Whether LoRA is on (``r > 0``)."""
        return self.r > 0

    @property
    def scaling(self) -> float:
        """``alpha / r``, the factor on ``B @ A``."""
        return self.alpha / self.r if self.r else 0.0


@dataclass
class ModelConfig:
    """The policy model that is trained and served."""

    name: str = "default"
    """``default`` (SmolLM2-135M-Instruct, offline), ``tiny`` (a randomly initialised model of
    the same architecture and tokenizer, a few MB: for tests only) or a local HF directory."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Learner parameter dtype (bf16 is ~5x slower than fp32 on CPUs without bf16 units)."""
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """The learner's compute dtype: ``bfloat16`` runs forward and backward under autocast, weights
    and output head in ``dtype`` (mixed precision, ``trainers/precision.py``; needs bf16 units)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more time)."""
    chat_template: str | None = None
    """The chat template every engine renders with: None (the model's own when it renders
    tools, else ``chatml_tools``), ``chatml_tools`` (areal_agents' ChatML template with Hermes
    tool calls), ``trl`` (TRL's training version of the model's template) or a Jinja file.
    Checked at start-up: it must be prefix-preserving over multi-turn tool dialogues."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (``model.lora.r=16``); off by default. Only the adapter is trained,
    checkpointed and pushed to the servers."""

    @classmethod
    def from_name(cls, name: str) -> ModelConfig:
        """``model=NAME``."""
        return cls(name=name)

    @classmethod
    def preset_names(cls) -> tuple[str, ...]:
        """The ``model`` config group's stored options (a model directory is accepted too)."""
        return ("default", "tiny")
