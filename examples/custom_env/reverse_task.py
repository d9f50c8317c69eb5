"""A user's own environment, registered with plain ``gym.register``.

The task: reverse a word. The model may call a ``reverse`` tool; the final answer goes in
``<answer>...</answer>``. Nothing here is special to areal_agents beyond subclassing
``MultiTurnEnv``; once registered, the id works with ``areal_agents.eval`` and
``areal_agents.train`` like a built-in one:

    python -m areal_agents.eval env=examples.custom_env.reverse_task:acme/Reverse-v0 ...

(the ``module:Id`` form makes Gymnasium import this module, which registers the id).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from areal_agents.envs import MultiTurnEnv, Score, Task
from areal_agents.envs.calculator import extract_final_answer
from areal_agents.tools import FunctionTool, Tool
from areal_agents.types import Turn

WORDS = ("gymnasium", "sandbox", "policy", "trajectory", "staleness", "learner", "reward")


class ReverseEnv(MultiTurnEnv):
    """Reverse a word; reward 1.0 for the exact reversed word in ``<answer>`` tags."""

    default_system_prompt = "Reverse the word. Answer as <answer>WORD</answer>."

    def make_tools(self, task: Task | None) -> Sequence[Tool]:
        return (
            FunctionTool(
                lambda text: text[::-1],
                name="reverse",
                description="Reverse a string.",
                parameters={
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"],
                },
            ),
        )

    def sample_task(self, rng: np.random.Generator) -> Task:
        word = str(rng.choice(WORDS))
        return Task(id=f"reverse-{word}", prompt=f"Reverse: {word}", answer=word[::-1])

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        answer = extract_final_answer(submission)
        return Score(float(answer == task.answer), {"answer": answer})


def register() -> None:
    """Register ``acme/Reverse-v0`` (idempotent)."""
    if "acme/Reverse-v0" not in gym.registry:
        gym.register(id="acme/Reverse-v0", entry_point=ReverseEnv, kwargs={"max_turns": 4})


register()

__all__: list[Any] = ["ReverseEnv", "register"]
