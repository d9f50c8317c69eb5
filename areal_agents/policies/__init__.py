"""Policies: clients that take turns through OpenAI-compatible endpoints.

* :class:`ChatPolicy` — any ``/v1/chat/completions`` endpoint, structured tool calls (eval).
* :class:`TokenPolicy` — token ids and log-probs through ``/v1/completions`` (training).
* :class:`ScriptedPolicy` — turns from a Python function (tests, examples).

The servers these clients talk to (the built-in server, the vLLM launcher, weight updates)
live in :mod:`areal_agents.serving`.
"""

from areal_agents.policies.base import Policy, ScriptedPolicy
from areal_agents.policies.chat_client import ChatPolicy
from areal_agents.policies.token_client import TokenPolicy

__all__ = ["ChatPolicy", "Policy", "ScriptedPolicy", "TokenPolicy"]
