"""The multi-turn tool-use environment: a real :class:`gymnasium.Env` over chat messages.

One episode is a conversation. ``reset`` picks a task and returns the opening messages;
each ``step`` takes an assistant turn, runs the tool calls it contains, and returns the tool
results as the next messages. A turn with no tool call (or a call to the ``final_tool``) is the
final answer: the episode terminates and the task's reward is computed. Reaching ``max_turns``
truncates the episode.

The model's mistakes never raise: an unparseable call, an unknown tool, arguments that do not
match the schema and a failing tool all become messages in the next observation and are
counted in ``info["tool_errors"]``. Only infrastructure faults
(:class:`~areal_agents.errors.InfrastructureError`) propagate, so that the caller can drop the
episode instead of scoring it.

Subclasses implement :meth:`MultiTurnEnv.sample_task` and :meth:`MultiTurnEnv.score`, and
usually :meth:`MultiTurnEnv.make_tools`; see ``areal_agents/envs/calculator.py`` for a
complete small example.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from areal_agents.envs.spaces import MessagesSpace, TurnSpace
from areal_agents.errors import ConfigError, InfrastructureError
from areal_agents.tools.base import Tool, validate_arguments
from areal_agents.tools.parsing import parse_tool_calls, strip_tool_calls
from areal_agents.types import Message, ToolCall, Turn

__all__ = ["ERROR_KINDS", "MultiTurnEnv", "Score", "Task"]

logger = logging.getLogger(__name__)

#: The kinds of tool-call mistakes counted in ``info["tool_errors"]``.
ERROR_KINDS = ("parse", "unknown_tool", "invalid_arguments", "tool_failure")


@dataclass(frozen=True)
class Task:
    """One problem: an id, the user prompt, and whatever the reward needs (answer, tests)."""

    id: str
    prompt: str
    answer: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> Task:
        """A task from a row with ``id``/``task_id``, ``prompt``/``question`` and ``answer``."""
        prompt = row.get("prompt", row.get("question"))
        if not isinstance(prompt, str):
            raise ConfigError(
                f"task row needs a 'prompt' or 'question' string, got keys {list(row)}"
            )
        task_id = str(row.get("id", row.get("task_id", "")))
        known = {"id", "task_id", "prompt", "question", "answer"}
        extra = {k: v for k, v in row.items() if k not in known}
        return cls(id=task_id, prompt=prompt, answer=row.get("answer"), metadata=extra)


@dataclass(frozen=True)
class Score:
    """The outcome of a final answer: the reward and a few JSON-able facts about it."""

    reward: float
    details: Mapping[str, Any] = field(default_factory=dict)


class MultiTurnEnv(gym.Env[list[dict[str, Any]], Any]):
    """Base class for multi-turn tool-use environments.

    Args:
        max_turns: assistant turns before the episode is truncated.
        max_tool_output_chars: tool results longer than this are cut (with a marker).
        final_tool: name of a tool whose call submits the final answer (e.g. ``"submit"``);
            its arguments go to :meth:`score` as the submission.
        system_prompt: replaces the environment's default system prompt when given.
        render_mode: ``"ansi"`` to get the conversation as text from ``render()``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}  # noqa: RUF012
    default_system_prompt: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        max_turns: int = 8,
        max_tool_output_chars: int = 4000,
        final_tool: str | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"max_turns={max_turns}: must be at least 1")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(
                f"render_mode={render_mode!r}: choose one of {self.metadata['render_modes']}"
            )
        self.max_turns = max_turns
        self.max_tool_output_chars = max_tool_output_chars
        self.final_tool = final_tool
        self.system_prompt = system_prompt
        self.render_mode = render_mode
        self.messages: list[Message] = []
        self.task: Task | None = None
        self._tools: dict[str, Tool] = {}
        self._turns = 0
        self._done = True
        self._errors: Counter[str] = Counter()
        self._calls = 0
        names = [t.spec.name for t in self.make_tools(None)]
        self.observation_space = MessagesSpace(max_messages=max(64, 4 * max_turns + 4))
        self.action_space = TurnSpace(tool_names=names)

    # ---- hooks for subclasses ------------------------------------------------------------

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Draw a task with the environment's seeded generator."""
        raise NotImplementedError

    def get_task(self, task_id: str) -> Task:
        """The task with this id (``reset(options={"task_id": ...})``)."""
        raise ConfigError(f"{type(self).__name__} cannot select tasks by id ({task_id!r})")

    def make_tools(self, task: Task | None) -> Sequence[Tool]:
        """The tools for ``task`` (``None`` asks for the tool set used to build the spaces)."""
        return ()

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        """Reward the final answer. ``submission`` is the answer text (or final tool's argument)."""
        raise NotImplementedError

    def setup(self, task: Task) -> None:
        """Acquire per-episode resources (a sandbox); ``reset`` calls it once the task is chosen."""

    def teardown(self) -> None:
        """Release per-episode resources. Called before the next ``reset`` and by ``close``."""

    def initial_messages(self, task: Task) -> list[Message]:
        """The opening conversation: the system prompt (if any) and the task as user message."""
        system = (
            self.system_prompt if self.system_prompt is not None else self.default_system_prompt
        )
        out = [Message.system(system)] if system else []
        return [*out, Message.user(task.prompt)]

    # ---- gymnasium API -------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        super().reset(seed=seed)
        self.teardown()
        options = options or {}
        if "task" in options:
            raw = options["task"]
            task = raw if isinstance(raw, Task) else Task.from_mapping(raw)
        elif "task_id" in options:
            task = self.get_task(str(options["task_id"]))
        else:
            task = self.sample_task(self.np_random)
        self.task = task
        self._tools = {t.spec.name: t for t in self.make_tools(task)}
        self._turns = 0
        self._calls = 0
        self._errors = Counter()
        self._done = False
        self.setup(task)
        self.messages = self.initial_messages(task)
        return [m.to_openai() for m in self.messages], self._info()

    def step(
        self, action: Turn | str | Mapping[str, Any]
    ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        if self._done or self.task is None:
            raise gym.error.ResetNeeded("the episode is over: call reset() before step()")
        turn = _as_turn(action)
        self._turns += 1
        calls, problems = self._tool_calls(turn)
        self.messages.append(Message.from_turn(turn, tool_calls=calls))

        final = next((c for c in calls if c.name == self.final_tool), None)
        if final is not None or (not calls and not problems):
            submission = strip_tool_calls(turn.text) if final is None else final.arguments
            score = self.score(self.task, submission, turn)
            self._done = True
            info = self._info(outcome="answered", reward_details=dict(score.details))
            return [], float(score.reward), True, False, info

        new = [Message.user(f"Error: could not parse tool call: {p.reason}") for p in problems]
        self._errors["parse"] += len(problems)
        for call in calls:
            new.append(self._run_call(call))
        self.messages.extend(new)
        obs = [m.to_openai() for m in new]
        if self._turns >= self.max_turns:
            self._done = True
            return obs, 0.0, False, True, self._info(outcome="max_turns")
        return obs, 0.0, False, False, self._info()

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        lines = []
        for m in self.messages:
            calls = "".join(f"\n  -> {c.name}({c.arguments})" for c in m.tool_calls)
            lines.append(f"[{m.role}] {m.content}{calls}")
        return "\n".join(lines)

    def close(self) -> None:
        self.teardown()
        super().close()

    # ---- machinery -----------------------------------------------------------------------

    @property
    def tool_specs(self) -> list[dict[str, Any]]:
        """The OpenAI tool schemas of the current episode (a fresh copy)."""
        return [copy.deepcopy(t.spec.to_openai()) for t in self._tools.values()]

    def _tool_calls(self, turn: Turn) -> tuple[list[ToolCall], list[Any]]:
        if turn.tool_calls is not None:
            named = [
                c if c.id else ToolCall(c.name, c.arguments, f"call_{self._turns}_{i}")
                for i, c in enumerate(turn.tool_calls)
            ]
            return named, []
        return parse_tool_calls(turn.text, id_prefix=f"call_{self._turns}")

    def _run_call(self, call: ToolCall) -> Message:
        self._calls += 1
        tool = self._tools.get(call.name)
        if tool is None:
            self._errors["unknown_tool"] += 1
            names = ", ".join(sorted(self._tools)) or "none"
            return Message.tool(
                f"Error: unknown tool {call.name!r}; available tools: {names}", call.id, call.name
            )
        try:
            arguments = call.parsed_arguments()
        except ValueError as e:
            self._errors["invalid_arguments"] += 1
            return Message.tool(f"Error: arguments are not a JSON object: {e}", call.id, call.name)
        problem = validate_arguments(tool.spec, arguments)
        if problem is not None:
            self._errors["invalid_arguments"] += 1
            return Message.tool(f"Error: invalid arguments: {problem}", call.id, call.name)
        try:
            output = tool.call(arguments)
        except InfrastructureError:
            raise
        except Exception as e:  # the tool failed on the model's input: report, go on
            self._errors["tool_failure"] += 1
            logger.debug("tool %s failed", call.name, exc_info=True)
            return Message.tool(f"Error: {type(e).__name__}: {e}", call.id, call.name)
        return Message.tool(self._cap(output), call.id, call.name)

    def _cap(self, text: str) -> str:
        limit = self.max_tool_output_chars
        if len(text) <= limit:
            return text
        return text[:limit] + f"\n...[truncated {len(text) - limit} characters]"

    def _info(self, **extra: Any) -> dict[str, Any]:
        info: dict[str, Any] = {
            "task_id": self.task.id if self.task else "",
            "turn": self._turns,
            "tools": self.tool_specs,
            "tool_calls": self._calls,
            "tool_errors": {kind: self._errors[kind] for kind in ERROR_KINDS},
        }
        info.update(extra)
        return info


def _as_turn(action: Turn | str | Mapping[str, Any]) -> Turn:
    if isinstance(action, Turn):
        return action
    if isinstance(action, str):
        return Turn(text=action)
    if isinstance(action, Mapping):
        message = Message.from_openai({"role": "assistant", **action})
        return Turn(text=message.content, tool_calls=message.tool_calls or None)
    raise TypeError(
        f"action must be a Turn, a str or an assistant message dict, got {type(action)}"
    )
