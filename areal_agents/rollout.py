"""Run one episode: a policy against an environment, turn by turn.

This is the loop that evaluation and training share. Environment calls run in a worker
thread (tools may block on a sandbox), so many episodes can share one event loop.
Infrastructure faults (:class:`~areal_agents.errors.InfrastructureError`) propagate: the caller
drops and counts the episode instead of scoring it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from areal_agents.envs.base import MultiTurnEnv
from areal_agents.envs.remote import RemoteEnv
from areal_agents.policies.base import Policy
from areal_agents.types import Message, ToolSpec, Trajectory, TrajectoryMetadata, Turn

__all__ = ["Episode", "run_episode"]


@dataclass(frozen=True)
class Episode:
    """A finished episode: the whole conversation, the policy's turns and the outcome."""

    task_id: str
    messages: tuple[Message, ...]
    turns: tuple[Turn, ...]
    reward: float
    terminated: bool
    truncated: bool
    tool_calls: int
    tool_errors: Mapping[str, int]
    duration_s: float
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def to_trajectory(
        self, group_id: str, metadata: TrajectoryMetadata | None = None
    ) -> Trajectory:
        """The episode as one token sequence (needs a token-level policy); ``metadata`` gets
        this episode's tool calls, tool errors and duration."""
        return Trajectory.from_turns(
            self.turns,
            reward=self.reward,
            group_id=group_id,
            task_id=self.task_id,
            terminated=self.terminated,
            truncated=self.truncated,
            metadata=dataclasses.replace(
                metadata or TrajectoryMetadata(),
                tool_calls=self.tool_calls,
                tool_errors=dict(self.tool_errors),
                duration_s=round(self.duration_s, 4),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-able transcript (what eval writes, one line per episode)."""
        return {
            "task_id": self.task_id,
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "num_turns": self.num_turns,
            "tool_calls": self.tool_calls,
            "tool_errors": dict(self.tool_errors),
            "num_policy_tokens": sum(len(t.completion_ids or ()) for t in self.turns),
            "duration_s": round(self.duration_s, 4),
            "messages": [m.to_openai() for m in self.messages],
            "info": _jsonable(self.info),
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items() if k != "tools"}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)


def _step(env: gym.Env[Any, Any], turn: Turn) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
    return env.step(turn)


async def run_episode(
    env: gym.Env[Any, Any],
    policy: Policy,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Episode:
    """Play one episode of ``env`` with ``policy`` and return it."""
    start = time.perf_counter()
    obs, info = await asyncio.to_thread(env.reset, seed=seed, options=options)
    task_id = str(info.get("task_id", ""))
    tools = [ToolSpec.from_openai(t) for t in info.get("tools", ())]
    conversation = [Message.from_openai(m) for m in obs]
    base = env.unwrapped if isinstance(env.unwrapped, MultiTurnEnv | RemoteEnv) else None
    turns: list[Turn] = []
    reward, terminated, truncated = 0.0, False, False
    while not (terminated or truncated):
        turn = await policy.act(conversation, tools)
        turns.append(turn)
        obs, reward, terminated, truncated, info = await asyncio.to_thread(_step, env, turn)
        if base is not None:  # the env knows the tool-call ids it assigned: use its record
            conversation = list(base.messages)
        else:
            conversation.append(Message.from_turn(turn))
            conversation.extend(Message.from_openai(m) for m in obs)
        tools = [ToolSpec.from_openai(t) for t in info.get("tools", ())] or tools
    return Episode(
        task_id=task_id,
        messages=tuple(conversation),
        turns=tuple(turns),
        reward=float(reward),
        terminated=bool(terminated),
        truncated=bool(truncated),
        tool_calls=int(info.get("tool_calls", 0)),
        tool_errors=dict(info.get("tool_errors", {})),
        duration_s=time.perf_counter() - start,
        info=info,
    )
