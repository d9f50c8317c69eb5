"""The configuration of ``python -m areal_agents.eval``: the endpoint and the run.

Every field is a key of the command line (``policy.max_tokens=256``, ``num_episodes=64``);
validation runs in ``__post_init__`` and names the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_agents.config import check_numbers
from areal_agents.errors import ConfigError

__all__ = ["EvalConfig", "EvalPolicyConfig"]


@dataclass
class EvalPolicyConfig:
    """The endpoint under evaluation (chat completions)."""

    base_url: str = ""
    """``http://host:port/v1``; empty starts the built-in server on ``model``."""
    model: str = "SmolLM2-135M-Instruct"
    """The served model name (or, for the built-in server, a model directory)."""
    api_key: str = ""
    """Empty reads ``AREAL_API_KEY`` / ``OPENAI_API_KEY`` from the environment."""
    temperature: float | None = None
    """Sampling temperature. Unset: 0.0 (greedy) with ``samples_per_task=1``, else 1.0 (pass@k
    needs distinct samples; greedy ones with ``samples_per_task > 1`` are refused)."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens whose probability reaches ``top_p``."""
    max_tokens: int = 512
    """New tokens per assistant turn (a longer reply is cut, ``finish_reason=length``)."""
    tool_choice: str = "auto"
    """Sent as the request's ``tool_choice`` (empty: not sent)."""
    timeout_s: float = 120.0
    """Seconds per request in all (connect, headers and the whole body)."""
    max_retries: int = 4
    """Retries per request on timeouts, malformed replies, 429 and 5xx (with backoff)."""
    backoff_s: float = 0.5
    """First retry delay (doubling, with jitter, capped at 30 s)."""
    max_response_mb: float = 32.0
    """Largest reply body read; a larger one counts as a malformed reply."""
    keep_reasoning: bool = False
    """Send earlier turns' reasoning (``reasoning_content``, ``<think>`` spans) back to the
    endpoint as a ``<think>`` block; false leaves it out of the context (it stays in the
    transcripts either way)."""

    def __post_init__(self) -> None:
        check_numbers(self, "policy", zero_ok={"backoff_s"})
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"policy.base_url={self.base_url!r}: expected http(s)://host:port/v1")
        if self.max_tokens < 1:
            raise ConfigError(f"policy.max_tokens={self.max_tokens}: must be at least 1")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"policy.top_p={self.top_p}: must be in (0, 1]")
        if self.max_response_mb <= 0:
            raise ConfigError(f"policy.max_response_mb={self.max_response_mb}: must be positive")


@dataclass
class EvalConfig:
    """Evaluation of one policy on one environment."""

    env: str = "calculator"
    """A short name (``calculator``) or a Gymnasium id."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gym.make`` (``env_kwargs={max_turns: 4}``)."""
    policy: EvalPolicyConfig = field(default_factory=EvalPolicyConfig)
    num_episodes: int = 16
    """Episodes in all: ``num_episodes / samples_per_task`` tasks."""
    samples_per_task: int = 1
    """Episodes per task (pass@k needs k <= samples_per_task)."""
    seed: int = 0
    """Task ``i`` is drawn by ``env.reset(seed=seed + i)``."""
    concurrency: int = 8
    """Episodes played at once."""
    pass_threshold: float = 1.0
    """An episode passes when its reward is at least this."""
    output_dir: str = ""
    """Where ``summary.json``, ``transcripts.jsonl``, ``config.yaml`` and ``index.html`` go
    (relative to the current directory). Empty: a new folder for each run,
    ``outputs/eval/<date>/<time>_<env>_<model>`` (Hydra's ``outputs/<date>/<time>``, with the env
    and the model named; ``_2``, ``_3``... when a run started in the same second has it)."""
    resume: bool = False
    """Keep finished episodes from ``output_dir`` and play only the missing ones (``--resume``)."""
    overwrite: bool = False
    """Replace an earlier evaluation in ``output_dir`` (without it, or ``resume``, a directory
    that holds one is refused)."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        check_numbers(self, signed={"pass_threshold"})
        if self.samples_per_task < 1:
            raise ConfigError(f"samples_per_task={self.samples_per_task}: must be at least 1")
        if self.num_episodes < 1 or self.num_episodes % self.samples_per_task:
            raise ConfigError(
                f"num_episodes={self.num_episodes} must be a positive multiple of "
                f"samples_per_task={self.samples_per_task}"
            )
        if self.concurrency < 1:
            raise ConfigError(f"concurrency={self.concurrency}: must be at least 1")
        if self.resume and self.overwrite:
            raise ConfigError("resume=true and overwrite=true: choose one")
        if self.resume and not self.output_dir:
            raise ConfigError(
                "resume=true (--resume) finishes an earlier evaluation: give its output_dir= "
                "(a run without one writes to a new folder, which it says at the end)"
            )
        if self.policy.temperature == 0 and self.samples_per_task > 1:
            raise ConfigError(
                f"policy.temperature=0 with samples_per_task={self.samples_per_task}: greedy "
                "samples of a task are identical, so pass@k would just repeat pass@1; set a "
                "positive policy.temperature (unset gives 1.0) or samples_per_task=1"
            )

    @property
    def temperature(self) -> float:
        """The sampling temperature used: ``policy.temperature``, or its default when unset
        (0.0 for ``samples_per_task=1``, 1.0 for pass@k over several samples)."""
        if self.policy.temperature is not None:
            return self.policy.temperature
        return 0.0 if self.samples_per_task == 1 else 1.0

    @property
    def num_tasks(self) -> int:
        return self.num_episodes // self.samples_per_task
