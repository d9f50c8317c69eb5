"""Policies behind OpenAI-compatible endpoints: clients, the built-in server, vLLM.

* :class:`ChatPolicy` — any ``/v1/chat/completions`` endpoint, structured tool calls (eval).
* :class:`TokenPolicy` — token ids and logprobs through ``/v1/completions`` (training).
* ``areal_agents.policies.server.BuiltinServer`` / ``python -m areal_agents.policies.serve`` —
  the built-in transformers server; ``areal_agents.policies.vllm.VLLMServer`` — stock vLLM.
* :class:`WeightSync` — how a trainer pushes weights to either.
* ``areal_agents.policies.model.default_model_path()`` — the offline default model.
"""

from areal_agents.policies.base import Policy, ScriptedPolicy
from areal_agents.policies.chat_client import ChatPolicy
from areal_agents.policies.token_client import TokenPolicy
from areal_agents.policies.weight_sync import WeightSync

__all__ = ["ChatPolicy", "Policy", "ScriptedPolicy", "TokenPolicy", "WeightSync"]
