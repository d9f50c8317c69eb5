"""Policies behind OpenAI-compatible endpoints: clients, the built-in server, vLLM."""

from areal_agents.policies.base import Policy, ScriptedPolicy

__all__ = ["Policy", "ScriptedPolicy"]
