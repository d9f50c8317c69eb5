"""The ``env`` section of the training configuration: which environment, how many samples of a
task, and how a broken episode is retried (``env=NAME`` selects a built-in preset)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_agents.config_values import check_numbers
from areal_agents.errors import ConfigError

__all__ = ["EnvConfig"]


@dataclass
class EnvConfig:
    """Which environment to train on, and how many samples per task."""

    name: str = "code_sandbox"
    """A short name (``code_sandbox``, ``calculator``, ...) or any registered Gymnasium id."""
    group_size: int = 4
    """Episodes per task; group-relative algorithms (GRPO, RLOO) compare samples of a group."""
    max_turns: int | None = None
    """Assistant turns before an episode is truncated (None: the environment's default)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``make_env`` (e.g. ``env.kwargs={sandbox: docker}``)."""
    episode_retries: int = 1
    """Times a broken episode (infrastructure fault) is retried before it is dropped."""

    def __post_init__(self) -> None:
        check_numbers(self, "env")
        if not self.name:
            raise ConfigError("env.name is empty: set env=<name or Gymnasium id>")
        if self.group_size < 1:
            raise ConfigError(f"env.group_size={self.group_size}: must be at least 1")
        if self.max_turns is not None and self.max_turns < 1:
            raise ConfigError(f"env.max_turns={self.max_turns}: must be at least 1")
        if self.episode_retries < 0:
            raise ConfigError(f"env.episode_retries={self.episode_retries}: must be 0 or more")

    @classmethod
    def from_name(cls, name: str) -> EnvConfig:
        """``env=NAME``: a built-in environment's preset sized for a small CPU machine (its
        ``train_max_turns``), or any other id as it is; the name is checked at start."""
        # imported here: the learner's configs load without gymnasium (e.g. on a GPU host that
        # only trains; benchmarks/gpu)
        from areal_agents.envs.registry import builtin_env

        builtin = builtin_env(name)
        return cls(name=name, max_turns=builtin.train_max_turns if builtin else None)

    @classmethod
    def preset_names(cls) -> tuple[str, ...]:
        """The ``env`` config group's stored options: the built-in environments' short names
        (any other Gymnasium id is accepted too, and stored when named)."""
        from areal_agents.envs.registry import BUILTIN_ENVS  # lazily, as in from_name

        return tuple(env.alias for env in BUILTIN_ENVS)

    def make_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for ``make_env``."""
        out = dict(self.kwargs)
        if self.max_turns is not None:
            out.setdefault("max_turns", self.max_turns)
        return out
