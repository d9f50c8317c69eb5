"""The contract between a trainer and its inference servers: :class:`InferenceServer`.

The built-in server's handle (:class:`~areal_agents.serving.server.BuiltinServer`), the vLLM
launcher (:class:`~areal_agents.serving.vllm.VLLMServer`) and the trainer's handle on a server
inside a Ray actor all implement it. Every method is bounded by a timeout and raises
:class:`~areal_agents.errors.WeightSyncError` on failure; none ever hangs. Clients generate
through ``base_url`` with the OpenAI protocol (:mod:`areal_agents.policies`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["LOGPROBS_MODES", "TRAINING_LOGPROBS_MODE", "InferenceServer"]

#: What an engine's reported log-probs are (vLLM's ``--logprobs-mode`` names, which the built-in
#: server takes too): the raw model's (the default of both), or those of the distribution each
#: token was drawn from, temperature and top-p applied.
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
#: The mode of the servers a training run starts: behaviour log-probs must be the sampling
#: distribution's, or a temperature other than 1 skews every importance weight.
TRAINING_LOGPROBS_MODE = "processed_logprobs"


@runtime_checkable
class InferenceServer(Protocol):
    """A running OpenAI-compatible server that accepts new policy weights."""

    base_url: str
    """``http://host:port/v1``: where clients send completions."""

    def update_weights_from_disk(self, path: str, version: int, timeout: float) -> None:
        """Load the HF safetensors checkpoint at ``path`` and serve it as ``version``."""
        ...

    def update_weights_from_state_dict(
        self, state: Mapping[str, torch.Tensor], version: int, timeout: float
    ) -> None:
        """Serve the tensors of ``state`` (HF parameter names) as ``version``."""
        ...

    def weight_version(self) -> int:
        """The version of the weights being served now."""
        ...

    def pause(self) -> None:
        """Stop generating; in-flight requests return early with ``finish_reason="abort"``."""
        ...

    def resume(self) -> None:
        """Generate again."""
        ...

    def stop(self) -> None:
        """Shut the server down (its process, or the actor that hosts it)."""
        ...
