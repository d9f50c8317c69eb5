"""Gymnasium spaces for chat: observations are lists of messages, actions are assistant turns.

Both are real :class:`gymnasium.spaces.Space` subclasses with ``contains`` and a seeded
``sample``, so ``gymnasium.utils.env_checker.check_env`` can drive an environment with random
actions, including well-formed and malformed tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from areal_agents.types import Turn

__all__ = ["MessagesSpace", "TurnSpace"]

_ROLES = ("system", "user", "assistant", "tool")
_OPTIONAL_KEYS = {"tool_calls": list, "tool_call_id": str, "name": str}
_WORDS = ("the", "answer", "is", "let", "me", "compute", "result", "value", "x", "42", "7", "+")


def _words(rng: np.random.Generator, low: int = 1, high: int = 12) -> str:
    return " ".join(rng.choice(_WORDS, size=int(rng.integers(low, high))).tolist())


class MessagesSpace(spaces.Space[list[dict[str, Any]]]):
    """Lists of OpenAI-format chat messages (dicts with ``role`` and ``content``)."""

    def __init__(self, max_messages: int = 64, seed: int | np.random.Generator | None = None):
        self.max_messages = max_messages
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if not isinstance(x, list) or len(x) > self.max_messages:
            return False
        return all(self._is_message(m) for m in x)

    @staticmethod
    def _is_message(m: Any) -> bool:
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            return False
        if not isinstance(m.get("content"), str):
            return False
        for key, value in m.items():
            if key in ("role", "content"):
                continue
            if key not in _OPTIONAL_KEYS or not isinstance(value, _OPTIONAL_KEYS[key]):
                return False
        return True

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, Any]]:
        n = int(self.np_random.integers(1, min(4, self.max_messages) + 1))
        return [
            {
                "role": str(self.np_random.choice(("user", "tool"))),
                "content": _words(self.np_random),
            }
            for _ in range(n)
        ]

    def __repr__(self) -> str:
        return f"MessagesSpace(max_messages={self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace) and other.max_messages == self.max_messages

    def __hash__(self) -> int:
        return hash(("MessagesSpace", self.max_messages))


class TurnSpace(spaces.Space[Any]):
    """Assistant turns: plain text (``str``) or a :class:`~areal_agents.types.Turn`.

    ``sample()`` returns text that is, at random, prose, a final answer, a well-formed Hermes
    ``<tool_call>`` to one of ``tool_names``, a call to an unknown tool, or malformed JSON.
    """

    def __init__(
        self,
        tool_names: Sequence[str] = (),
        max_length: int = 1 << 20,
        seed: int | np.random.Generator | None = None,
    ):
        self.tool_names = tuple(tool_names)
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if isinstance(x, Turn):
            return len(x.text) <= self.max_length
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        rng = self.np_random
        kind = int(rng.integers(0, 5))
        if kind == 0 or not self.tool_names:
            return _words(rng)
        if kind == 1:
            return f"{_words(rng)} \\boxed{{{int(rng.integers(0, 100))}}}"
        if kind == 2:
            name = str(rng.choice(self.tool_names))
            args = {"code" if rng.random() < 0.5 else "expression": _words(rng, 1, 4)}
            return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
        if kind == 3:
            return '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>'
        return '<tool_call>{"name": "' + _words(rng, 1, 3) + "</tool_call>"

    def __repr__(self) -> str:
        return f"TurnSpace(tool_names={self.tool_names})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TurnSpace) and other.tool_names == self.tool_names

    def __hash__(self) -> int:
        return hash(("TurnSpace", self.tool_names))
