"""Sandboxes for model-written code: Docker (with a warm pool), bubblewrap, plain process."""

from areal_agents.sandboxes.base import ExecResult, Sandbox

__all__ = ["ExecResult", "Sandbox"]
