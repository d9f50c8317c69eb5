"""The multi-turn tool-use environment: a real :class:`gymnasium.Env` over chat messages.

One episode is a conversation. ``reset`` picks a task and returns the opening messages;
each ``step`` takes an assistant turn, runs the tool calls it contains, and returns the tool
results as the next messages. A turn with no tool call (or a call to the ``final_tool``) is the
final answer: the episode terminates and the task's reward is computed. Reaching ``max_turns``
truncates the episode.

The model's mistakes never raise: an action that is not text (see
:mod:`~areal_agents.envs.actions`), an unparseable call, an unknown tool, arguments that do not
match the schema, a failing tool, more calls in one turn than ``max_tool_calls_per_turn`` and
calls past the turn's time budget all become messages in the next observation and are counted
in ``info["tool_errors"]``. A turn with such a problem is never taken as the final answer
(unless it also calls the ``final_tool``). Only infrastructure faults
(:class:`~areal_agents.errors.InfrastructureError`) propagate, so that the caller can drop the
episode instead of scoring it.

Bounds: one turn runs at most ``max_tool_calls_per_turn`` calls and spends at most
``turn_time_budget_s`` seconds in tools (a tool whose ``call`` takes ``timeout_s`` gets what is
left of the budget as its limit; calls once it is spent are not run). Every observation
message is valid UTF-8 and at most ``max_tool_output_chars`` long, and one observation holds
at most ``max_tool_calls_per_turn + 3`` messages (the results, then up to three notes:
an unusable reply, unparseable calls, refused calls).

Subclasses implement :meth:`MultiTurnEnv.sample_task` and :meth:`MultiTurnEnv.score`, and
usually :meth:`MultiTurnEnv.make_tools`; see ``areal_agents/envs/calculator.py`` for a
complete small example. :meth:`MultiTurnEnv.demonstration` (optional) gives the trainer's warm
start a solved episode to imitate.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym
import numpy as np

from areal_agents.envs._checks import (
    check_int,
    check_kwargs,
    check_optional_str,
    check_positive,
    parameter_names,
)
from areal_agents.envs.actions import clean_text, coerce_action
from areal_agents.envs.spaces import MessagesSpace, TurnSpace
from areal_agents.errors import ConfigError, InfrastructureError, ToolTimeout, did_you_mean
from areal_agents.tools.base import Tool, call_tool, validate_arguments
from areal_agents.tools.parsing import ParseProblem, load_json, parse_tool_calls, strip_tool_calls
from areal_agents.types import Message, ToolCall, Turn

if TYPE_CHECKING:
    from areal_agents.rewards.judge import EnvJudge

__all__ = ["ERROR_KINDS", "MultiTurnEnv", "Score", "Task"]

logger = logging.getLogger(__name__)

#: The kinds of tool-call mistakes counted in ``info["tool_errors"]``: ``parse`` (a call or
#: a whole action that could not be read), ``unknown_tool``, ``invalid_arguments``,
#: ``tool_failure``, ``timeout`` (a call that ran out of its time limit: the tool raised
#: :class:`~areal_agents.errors.ToolTimeout`), ``too_many_calls`` (calls past
#: ``max_tool_calls_per_turn``, not run) and ``time_budget`` (calls not run because the turn's
#: time budget was spent).
ERROR_KINDS = (
    "parse",
    "unknown_tool",
    "invalid_arguments",
    "tool_failure",
    "timeout",
    "too_many_calls",
    "time_budget",
)
_MAX_REASONS = 8  # parse problems spelled out in one observation (all are counted)


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
        max_tool_calls_per_turn: calls run per turn; the rest are refused in one message.
        turn_time_budget_s: seconds one turn may spend in tools (see the module docstring).
        final_tool: name of a tool whose call submits the final answer (e.g. ``"submit"``);
            its arguments go to :meth:`score` as the submission.
        system_prompt: replaces the environment's default system prompt when given.
        render_mode: ``"ansi"`` to get the conversation as text from ``render()``.
        judge: a model that grades the final answer too, through any OpenAI-compatible
            endpoint: ``{base_url, model, rubric, ...}`` (see
            :class:`~areal_agents.rewards.judge.EnvJudge`). The reward is then
            ``program_weight * score + weight * verdict``; a judge that gives no verdict
            raises :class:`~areal_agents.rewards.judge.JudgeError` (the episode is dropped).

    Every argument is checked here (type and range, unknown keys with a did-you-mean), so a
    wrong configuration fails before the first episode.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}  # noqa: RUF012
    default_system_prompt: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        max_turns: int = 8,
        max_tool_output_chars: int = 4000,
        max_tool_calls_per_turn: int = 8,
        turn_time_budget_s: float = 60.0,
        final_tool: str | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
        judge: Any = None,
        **unknown: Any,
    ) -> None:
        names = parameter_names(type(self).__init__, MultiTurnEnv.__init__)
        check_kwargs(type(self).__name__, unknown, names)
        self.max_turns = check_int("max_turns", max_turns, minimum=1)
        self.max_tool_output_chars = check_int(
            "max_tool_output_chars", max_tool_output_chars, minimum=1
        )
        self.max_tool_calls_per_turn = check_int(
            "max_tool_calls_per_turn", max_tool_calls_per_turn, minimum=1
        )
        self.turn_time_budget_s = check_positive("turn_time_budget_s", turn_time_budget_s)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(
                f"render_mode={render_mode!r}: choose one of {self.metadata['render_modes']}"
            )
        self.final_tool = check_optional_str("final_tool", final_tool)
        self.system_prompt = check_optional_str("system_prompt", system_prompt)
        self.render_mode = render_mode
        self.judge: EnvJudge | None = None
        if judge is not None:  # imported on demand: it loads an HTTP client
            from areal_agents.rewards.judge import EnvJudge

            self.judge = EnvJudge.from_config(judge)
        self.messages: list[Message] = []
        self.task: Task | None = None
        self._tools: dict[str, Tool] = {}
        self._turns = 0
        self._done = True
        self._errors: Counter[str] = Counter()
        self._calls = 0
        tool_names = [t.spec.name for t in self._checked_tools(None)]
        if final_tool is not None and tool_names and final_tool not in tool_names:
            raise ConfigError(
                f"final_tool={final_tool!r}{did_you_mean(final_tool, tool_names)}: "
                f"not one of the tools ({', '.join(tool_names) or 'none'})"
            )
        per_step = max_tool_calls_per_turn + 3  # tool results and up to three notes
        self.observation_space = MessagesSpace(max_messages=max(64, 4 * max_turns + 4, per_step))
        self.action_space = TurnSpace(tool_names=tool_names)

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

    def _checked_tools(self, task: Task | None) -> list[Tool]:
        """``make_tools(task)`` as a list, or a ConfigError naming the method and what it gave."""
        tools = self.make_tools(task)
        where = f"{type(self).__name__}.make_tools({'None' if task is None else 'task'})"
        if tools is None or isinstance(tools, str | bytes | Mapping):
            raise ConfigError(
                f"{where} returned {type(tools).__name__}: it must return a list of Tool objects "
                "(an empty list for none)"
            )
        try:
            tools = list(tools)
        except TypeError:
            raise ConfigError(
                f"{where} returned {type(tools).__name__}, not a list of Tool objects"
            ) from None
        for tool in tools:
            if not isinstance(getattr(getattr(tool, "spec", None), "name", None), str):
                raise ConfigError(
                    f"{where} returned {tool!r:.80}, which is not a Tool (an object with "
                    ".spec.name and .call; see areal_agents.tools.FunctionTool)"
                )
        return tools

    def demonstration(self, task: Task) -> list[dict[str, Any]] | None:
        """Assistant turns that solve ``task``, for the trainer's supervised warm start
        (:mod:`areal_agents.trainers.warm_start`): OpenAI assistant message dicts, tool calls
        included, which ``step`` accepts in order; None when there are none. The trainer plays
        a multi-turn demonstration through ``step`` (the tool results are the environment's
        own) and keeps it only if it scores full reward; a one-turn demonstration (a reference
        answer) is kept as written. The default: the task's
        ``metadata["canonical_solution"]`` as one fenced ``python`` block, if it has one."""
        solution = task.metadata.get("canonical_solution")
        if not isinstance(solution, str) or not solution.strip():
            return None
        return [{"role": "assistant", "content": f"```python\n{solution.rstrip()}\n```"}]

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
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"reset(options={options!r}): options must be a dict such as "
                "{'task_id': ...} or {'task': {...}}"
            )
        if "task" in options:
            raw = options["task"]
            if isinstance(raw, Task):
                task = raw
            elif isinstance(raw, Mapping):
                task = Task.from_mapping(raw)
            else:
                raise ConfigError(
                    f"reset(options={{'task': {raw!r:.80}}}): the task must be a Task or a "
                    "mapping with 'prompt' (or 'question') and 'answer', got "
                    f"{type(raw).__name__}"
                )
        elif "task_id" in options:
            task = self.get_task(str(options["task_id"]))
        else:
            task = self.sample_task(self.np_random)
        self.task = task
        self._tools = {t.spec.name: t for t in self._checked_tools(task)}
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
        """Take one assistant turn (any value: see :mod:`~areal_agents.envs.actions`)."""
        if self._done or self.task is None:
            raise gym.error.ResetNeeded("the episode is over: call reset() before step()")
        turn, unusable = coerce_action(action)
        self._turns += 1
        calls, problems = self._tool_calls(turn)
        run, refused = calls[: self.max_tool_calls_per_turn], calls[self.max_tool_calls_per_turn :]
        self.messages.append(Message.from_turn(turn, tool_calls=run))

        final = next((c for c in calls if c.name == self.final_tool), None)
        if final is not None or (not calls and not problems and not unusable):
            submission = strip_tool_calls(turn.text) if final is None else final.arguments
            score = self.score(self.task, submission, turn)
            if self.judge is not None:
                score = Score(
                    *self.judge.rescore(
                        score.reward,
                        score.details,
                        submission,
                        question=self.task.prompt,
                        reference=self.task.answer,
                    )
                )
            self._done = True
            info = self._info(outcome="answered", reward_details=dict(score.details))
            return [], float(score.reward), True, False, info

        new = self._run_calls(run)
        notes = []
        self._errors["parse"] += len(unusable) + len(problems)
        if unusable:
            notes.append(_reasons("Error: unusable reply: ", unusable))
        if problems:
            notes.append(_reasons("Error: could not parse tool call: ", problems))
        if refused:
            self._errors["too_many_calls"] += len(refused)
            notes.append(
                f"Error: {len(calls)} tool calls in one turn; only the first "
                f"{self.max_tool_calls_per_turn} were run, the other {len(refused)} were not"
            )
        new += [Message.user(clean_text(self._cap(note))) for note in notes]
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

    def _tool_calls(self, turn: Turn) -> tuple[list[ToolCall], list[ParseProblem]]:
        if turn.tool_calls is not None:
            named = [
                c if c.id else ToolCall(c.name, c.arguments, f"call_{self._turns}_{i}")
                for i, c in enumerate(turn.tool_calls)
            ]
            return named, []
        return parse_tool_calls(turn.text, id_prefix=f"call_{self._turns}")

    def _run_calls(self, calls: list[ToolCall]) -> list[Message]:
        """Run the turn's calls in order within ``turn_time_budget_s``; one message per call."""
        deadline = time.monotonic() + self.turn_time_budget_s
        out = []
        for call in calls:
            left = deadline - time.monotonic()
            if left <= 0:
                self._errors["time_budget"] += 1
                text = (
                    f"Error: not run: this turn's tool time budget of "
                    f"{self.turn_time_budget_s:g} s is used up"
                )
            else:
                text = self._run_call(call, left)
            out.append(Message.tool(clean_text(self._cap(text)), call.id, call.name))
        return out

    def _run_call(self, call: ToolCall, time_left: float) -> str:
        """The text the model reads for one call (errors are counted, never raised)."""
        self._calls += 1
        tool = self._tools.get(call.name)
        if tool is None:
            self._errors["unknown_tool"] += 1
            names = ", ".join(sorted(self._tools)) or "none"
            return f"Error: unknown tool {call.name!r}; available tools: {names}"
        try:
            arguments = load_json(call.arguments) if call.arguments.strip() else {}
        except ValueError as e:
            self._errors["invalid_arguments"] += 1
            return f"Error: arguments are not a JSON object: {e}"
        if not isinstance(arguments, dict):
            self._errors["invalid_arguments"] += 1
            return (
                "Error: arguments are not a JSON object: arguments must be a JSON object, "
                f"got {type(arguments).__name__}"
            )
        problem = validate_arguments(tool.spec, arguments)
        if problem is not None:
            self._errors["invalid_arguments"] += 1
            return f"Error: invalid arguments: {problem}"
        try:
            output = call_tool(tool, arguments, timeout_s=time_left)
        except InfrastructureError:
            raise
        except ToolTimeout as e:  # the model's program ran too long: its report, counted
            self._errors["timeout"] += 1
            return e.output
        except Exception as e:  # the tool failed on the model's input: report, go on
            self._errors["tool_failure"] += 1
            logger.debug("tool %s failed", call.name, exc_info=True)
            return f"Error: {type(e).__name__}: {e}"
        return output if isinstance(output, str) else str(output)

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


def _reasons(prefix: str, problems: list[ParseProblem]) -> str:
    """One message for several problems (the first few spelled out; all are counted)."""
    lines = [prefix + p.reason for p in problems[:_MAX_REASONS]]
    if len(problems) > _MAX_REASONS:
        lines.append(f"... and {len(problems) - _MAX_REASONS} more like these")
    return "\n".join(lines)
