"""Data that crosses component boundaries: messages, tool calls, turns and trajectories.

Everything here is a frozen dataclass with no dependency beyond the standard library, so an
environment, a policy client and a learner can exchange them without importing one another.

>>> call = ToolCall(name="calculator", arguments='{"expression": "2+2"}', id="call_0")
>>> call.parsed_arguments()
{'expression': '2+2'}
>>> Message.assistant("", tool_calls=(call,)).to_openai()["tool_calls"][0]["function"]["name"]
'calculator'
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Message",
    "Role",
    "ToolCall",
    "ToolSpec",
    "Trajectory",
    "TrajectoryMetadata",
    "Turn",
]

Role = Literal["system", "user", "assistant", "tool"]
_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class ToolCall:
    """One function call requested by the model.

    ``arguments`` is the JSON text exactly as the model (or the endpoint) produced it; it is
    parsed lazily so that malformed arguments can be reported back to the model instead of
    failing at construction.
    """

    name: str
    arguments: str = "{}"
    id: str = ""

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; raises ``ValueError`` when they are not a JSON object."""
        value = json.loads(self.arguments) if self.arguments.strip() else {}
        if not isinstance(value, dict):
            raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
        return value

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry for this call."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_openai(cls, data: Mapping[str, Any]) -> ToolCall:
        """Build from an OpenAI ``tool_calls`` entry (dict form)."""
        function = data.get("function") or {}
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        return cls(
            name=str(function.get("name", "")), arguments=arguments, id=str(data.get("id", ""))
        )


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: the OpenAI function schema."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"tool name {self.name!r} must be non-empty [A-Za-z0-9_-]")
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema of type object")

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    @classmethod
    def from_openai(cls, data: Mapping[str, Any]) -> ToolSpec:
        """Build from an OpenAI ``tools`` entry."""
        function = data.get("function", data)
        return cls(
            name=str(function["name"]),
            description=str(function.get("description", "")),
            parameters=dict(function.get("parameters") or {"type": "object", "properties": {}}),
        )


@dataclass(frozen=True)
class Turn:
    """One assistant turn as produced by a policy.

    ``tool_calls`` is ``None`` when the endpoint did not parse tool calls (the environment then
    parses them from ``text``), and a tuple (possibly empty) when it did. ``id`` names the turn
    for the client that produced it (the assistant message keeps it, see
    :meth:`Message.from_turn`), so that a token-level client finds its own sampled tokens
    again without the conversation carrying them. The token fields are
    filled by token-level clients: ``prompt_ids`` is the whole context the turn was sampled
    from; ``completion_ids``, ``behavior_logprobs`` (the sampling policy's log-probs) and
    ``versions`` describe the sampled tokens (one policy version per token, since a weight update
    may land in the middle of a turn).
    """

    text: str
    tool_calls: tuple[ToolCall, ...] | None = None
    id: str = ""
    completion_ids: tuple[int, ...] | None = None
    behavior_logprobs: tuple[float, ...] | None = None
    versions: tuple[int, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    finish_reason: str | None = None
    usage: Mapping[str, int] | None = field(default=None, compare=False, hash=False)
    """Token counts the endpoint reported (``prompt_tokens``, ``completion_tokens``), if any."""
    reasoning: str | None = None
    """Reasoning an endpoint returned apart from ``text`` (OpenAI-style ``reasoning_content``,
    from a server with a reasoning parser). A token-level turn keeps its ``<think>`` span inside
    ``text``, exactly as sampled, and leaves this None."""

    def __post_init__(self) -> None:
        n = None if self.completion_ids is None else len(self.completion_ids)
        for name in ("behavior_logprobs", "versions"):
            value = getattr(self, name)
            if value is not None and (n is None or len(value) != n):
                raise ValueError(f"Turn.{name} has {len(value)} entries for {n} completion ids")

    @property
    def version(self) -> int | None:
        """The newest policy version that produced any token of this turn."""
        return max(self.versions) if self.versions else None


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Message:
    """A chat message in the OpenAI format.

    ``turn_id`` is provenance, not content: for an assistant message that a policy produced, it
    is the :attr:`Turn.id`, by which the client that sampled the turn finds its token ids again
    (the ids stay in the client; the message carries only the name). It is never sent over the
    wire and does not take part in equality.
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None
    """An assistant's reasoning when the endpoint returned it apart from ``content`` (kept in
    transcripts; what a client sends back of it is the client's choice)."""
    turn_id: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(f"unknown role {self.role!r}; expected one of {sorted(_ROLES)}")

    @classmethod
    def system(cls, content: str) -> Message:
        return cls("system", content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: str, tool_calls: Sequence[ToolCall] = ()) -> Message:
        return cls("assistant", content, tool_calls=tuple(tool_calls))

    @classmethod
    def tool(cls, content: str, tool_call_id: str, name: str | None = None) -> Message:
        return cls("tool", content, tool_call_id=tool_call_id, name=name)

    @classmethod
    def from_turn(cls, turn: Turn, tool_calls: Sequence[ToolCall] | None = None) -> Message:
        """The assistant message for ``turn``, keeping the turn's id as provenance."""
        calls = tuple(tool_calls if tool_calls is not None else (turn.tool_calls or ()))
        reasoning = turn.reasoning
        return cls("assistant", turn.text, calls, reasoning_content=reasoning, turn_id=turn.id)

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat ``messages`` entry."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        return out

    @classmethod
    def from_openai(cls, data: Mapping[str, Any]) -> Message:
        """Build from an OpenAI chat ``messages`` entry."""
        content = data.get("content") or ""
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        return cls(
            role=data["role"],
            content=str(content),
            tool_calls=tuple(ToolCall.from_openai(c) for c in data.get("tool_calls") or ()),
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            reasoning_content=_text_or_none(data.get("reasoning_content", data.get("reasoning"))),
        )


@dataclass(frozen=True)
class TrajectoryMetadata:
    """Where a trajectory came from and how its episode went: for logs and transcripts (no
    learner reads it). The rollout fills the episode's part, the rollout worker its own."""

    traj_id: str = ""
    """``<task index>-<sample>``: unique in a run."""
    task_index: int = -1
    """The task's position in the run's task stream."""
    sample: int = 0
    """Which sample of its group."""
    attempt: int = 0
    """Retries its episode needed after infrastructure faults."""
    worker: int = 0
    """The rollout worker that played it."""
    duration_s: float = 0.0
    """Wall time of the episode."""
    tool_calls: int = 0
    """Tool calls the environment ran."""
    tool_errors: Mapping[str, int] = field(default_factory=dict)
    """The model's tool-call mistakes by kind (see ``envs.ERROR_KINDS``)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (checkpoints, transcripts)."""
        return {**dataclasses.asdict(self), "tool_errors": dict(self.tool_errors)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrajectoryMetadata:
        """The inverse of :meth:`to_dict` (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Trajectory:
    """One episode as a single token sequence, ready for a learner.

    ``loss_mask[i]`` is 1 where token ``i`` was sampled by the policy and 0 for prompt, tool
    and template tokens. ``behavior_logprobs[i]`` and ``versions[i]`` describe the policy that
    sampled token ``i`` (0.0 and -1 where the mask is 0).
    """

    sequence_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    behavior_logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    reward: float
    group_id: str
    task_id: str = ""
    num_turns: int = 0
    terminated: bool = True
    truncated: bool = False
    metadata: TrajectoryMetadata = field(default_factory=TrajectoryMetadata, compare=False)

    def __post_init__(self) -> None:
        n = len(self.sequence_ids)
        for name in ("loss_mask", "behavior_logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Trajectory.{name} has {len(getattr(self, name))} entries for {n} tokens"
                )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("Trajectory.loss_mask must hold only 0 and 1")

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def min_version(self) -> int:
        """Oldest policy version among the policy tokens (-1 when there are none)."""
        own = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(own) if own else -1

    @classmethod
    def from_turns(
        cls,
        turns: Sequence[Turn],
        *,
        reward: float,
        group_id: str,
        task_id: str = "",
        terminated: bool = True,
        truncated: bool = False,
        metadata: TrajectoryMetadata | None = None,
    ) -> Trajectory:
        """Join token-level turns into one trajectory.

        Each turn's ``prompt_ids`` must extend the previous turn's prompt plus its sampled
        tokens (the token client guarantees this); the tokens between are the environment's
        (tool results, template) and get mask 0.
        """
        if not turns:
            raise ValueError("a trajectory needs at least one turn")
        sequence_ids: list[int] = []
        mask: list[int] = []
        behavior_logprobs: list[float] = []
        versions: list[int] = []
        for i, turn in enumerate(turns):
            if (
                turn.prompt_ids is None
                or turn.completion_ids is None
                or turn.behavior_logprobs is None
            ):
                raise ValueError(f"turn {i} has no token ids/logprobs: use a token-level policy")
            prompt = turn.prompt_ids
            if tuple(sequence_ids) != prompt[: len(sequence_ids)]:
                raise ValueError(f"turn {i}: prompt does not extend the previous turns' tokens")
            extra = len(prompt) - len(sequence_ids)
            sequence_ids.extend(prompt[len(sequence_ids) :])
            mask.extend([0] * extra)
            behavior_logprobs.extend([0.0] * extra)
            versions.extend([-1] * extra)
            sequence_ids.extend(turn.completion_ids)
            mask.extend([1] * len(turn.completion_ids))
            behavior_logprobs.extend(turn.behavior_logprobs)
            versions.extend(turn.versions or [0] * len(turn.completion_ids))
        return cls(
            sequence_ids=tuple(sequence_ids),
            loss_mask=tuple(mask),
            behavior_logprobs=tuple(behavior_logprobs),
            versions=tuple(versions),
            reward=float(reward),
            group_id=group_id,
            task_id=task_id,
            num_turns=len(turns),
            terminated=terminated,
            truncated=truncated,
            metadata=metadata or TrajectoryMetadata(),
        )
