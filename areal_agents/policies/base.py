"""The Policy contract: given the conversation and the tool schemas, produce the next turn.

Two clients implement it over the same OpenAI wire protocol: a *chat* client (any endpoint,
structured tool calls; for evaluation) and a *token* client (token ids in and out with
logprobs; for training). :class:`ScriptedPolicy` is an honest fake for tests and examples: it
produces text from a Python function and no token data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from areal_agents.types import Message, ToolSpec, Turn

__all__ = ["Policy", "ScriptedPolicy"]


@runtime_checkable
class Policy(Protocol):
    """Anything that can take the next assistant turn."""

    async def act(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> Turn:
        """The next assistant turn for ``conversation`` (which ends with user/tool messages).

        Assistant messages in ``conversation`` that this policy produced carry their turn's
        :attr:`Turn.id` in ``Message.turn_id``, so that a token-level policy can look up the
        exact token ids it sampled (it keeps them; the conversation does not).
        """
        ...


class ScriptedPolicy:
    """A policy whose turns come from ``script(conversation, tools) -> str``; no model involved."""

    def __init__(self, script: Callable[[Sequence[Message], Sequence[ToolSpec]], str]) -> None:
        self._script = script

    async def act(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> Turn:
        return Turn(text=self._script(conversation, tools), finish_reason="stop")
