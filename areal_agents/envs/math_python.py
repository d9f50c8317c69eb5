r"""``areal_agents/MathPython-v0``: tool-integrated math reasoning.

The model may run Python (standard library) in the episode's sandbox to compute; its final
answer goes in ``\boxed{...}``. The reward is symbolic equivalence by ``math-verify``
(``1/2``, ``0.5`` and ``\frac{2}{4}`` are the same answer). Tasks come from reasoning-gym's
generators (``source="reasoning_gym"``, offline, seeded; arithmetic and word problems by
default) or a JSONL file (``source="jsonl"``, ``path=`` rows of ``question``/``answer``).

Logic puzzles work with no new code: with ``datasets=("knights_knaves",)`` (any reasoning-gym
dataset whose answers are not numbers) the answer is scored by that dataset's own verifier.

>>> env = MathPythonEnv(sandbox_backend="process")
>>> task = {"id": "half", "question": "What is 1/2?", "answer": "0.5"}
>>> obs, info = env.reset(options={"task": task})
>>> env.step(r"It is \boxed{\frac{2}{4}}")[1]
1.0
>>> env.close()
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from areal_agents.envs._checks import check_choice, check_names, check_timeout
from areal_agents.envs.base import MultiTurnEnv, Score, Task
from areal_agents.envs.tasks.base import TaskSource
from areal_agents.envs.tasks.math import (
    DEFAULT_MATH_DATASETS,
    NUMERIC_DATASETS,
    ReasoningGymTasks,
    math_tasks_from_jsonl,
)
from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.rewards.isolation import prewarm
from areal_agents.rewards.logic import ReasoningGymReward
from areal_agents.rewards.math import MathEquivalence
from areal_agents.tools.base import Tool
from areal_agents.tools.python_tool import EpisodeSandbox, PythonTool
from areal_agents.types import Turn

__all__ = ["MATH_VERIFIERS", "MathPythonEnv"]

MATH_VERIFIERS = ("auto", "math_verify", "reasoning_gym")


class MathPythonEnv(MultiTurnEnv):
    r"""Math word problems with a ``python`` tool; answer in ``\boxed{}``.

    Args:
        source: ``"reasoning_gym"``, ``"jsonl"`` or a TaskSource.
        datasets: reasoning-gym dataset names to draw from.
        dataset_config: per-dataset reasoning-gym options (difficulty and so on).
        path: the JSONL file for ``source="jsonl"``.
        verifier: ``"math_verify"``, ``"reasoning_gym"`` (the dataset's own ``score_answer``)
            or ``"auto"``: reasoning-gym's verifier for non-numeric reasoning-gym datasets,
            math-verify for everything else.
        tools: ``("python",)`` or ``()`` (no tool: plain chain-of-thought).
        sandbox_backend, sandbox_options: where the ``python`` tool runs.
        tool_timeout_s: time limit of one ``python`` call.
        verify_timeout_s: time limit of one answer check (it runs in a grading process that is
            killed at the limit; the answer then scores status ``"timeout"``).
        turn_time_budget_s: seconds of tool time per turn (default ``3 * tool_timeout_s``).
        **kwargs: :class:`~areal_agents.envs.base.MultiTurnEnv` options (``max_turns``,
            ``max_tool_calls_per_turn`` ...).
    """

    default_system_prompt: ClassVar[str | None] = (
        "Solve the problem step by step. You may run Python code with the python tool to "
        "compute (print the values you need). Give the final answer as \\boxed{answer}."
    )

    def __init__(
        self,
        *,
        source: str | TaskSource = "reasoning_gym",
        datasets: Sequence[str] = DEFAULT_MATH_DATASETS,
        dataset_config: Mapping[str, Mapping[str, Any]] | None = None,
        path: str | None = None,
        verifier: str = "auto",
        tools: Sequence[str] = ("python",),
        sandbox_backend: str = "auto",
        sandbox_options: Mapping[str, Any] | None = None,
        tool_timeout_s: float = 10.0,
        verify_timeout_s: float = 10.0,
        max_turns: int = 6,
        turn_time_budget_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.verifier = check_choice("verifier", verifier, MATH_VERIFIERS)
        self.tools = check_names("tools", tools, ("python",), what="tool")
        self.tool_timeout_s = check_timeout("tool_timeout_s", tool_timeout_s)
        verify_timeout_s = check_timeout("verify_timeout_s", verify_timeout_s)
        datasets = check_names("datasets", datasets, what="dataset")
        if isinstance(source, str):
            if source == "reasoning_gym":
                self.source: TaskSource = ReasoningGymTasks(datasets, config=dataset_config)
            elif source == "jsonl":
                if path is None:
                    raise ConfigError("source='jsonl' needs path=<file.jsonl> (question, answer)")
                self.source = math_tasks_from_jsonl(path)
            else:
                choices = ("reasoning_gym", "jsonl")
                raise ConfigError(
                    f"unknown math task source {source!r}{did_you_mean(source, choices)}; "
                    "choose 'reasoning_gym' or 'jsonl', or pass a TaskSource"
                )
        else:
            self.source = source
        self.sandbox = EpisodeSandbox(sandbox_backend, sandbox_options)
        self.math_reward = MathEquivalence(timeout_s=verify_timeout_s)
        self.logic_reward = ReasoningGymReward(timeout_s=verify_timeout_s)
        if turn_time_budget_s is None:
            turn_time_budget_s = 3 * self.tool_timeout_s
        super().__init__(max_turns=max_turns, turn_time_budget_s=turn_time_budget_s, **kwargs)
        # start the grading process now, so that the first answer finds it warm
        logic = self.verifier != "math_verify" and not set(datasets) <= NUMERIC_DATASETS
        prewarm(modules=("areal_agents.rewards.logic",) if logic else ())

    def sample_task(self, rng: np.random.Generator) -> Task:
        return self.source.sample(rng)

    def get_task(self, task_id: str) -> Task:
        return self.source.get(task_id)

    def make_tools(self, task: Task | None) -> Sequence[Tool]:
        if "python" not in self.tools:
            return ()
        return (PythonTool(self.sandbox, timeout_s=self.tool_timeout_s),)

    def demonstration(self, task: Task) -> list[dict[str, Any]] | None:
        r"""An arithmetic task solved with the tool: one ``python`` call printing the task's
        expression (reasoning-gym's ``metadata["expression"]``), then ``\boxed{answer}``;
        None for tasks without an expression (word problems, puzzles, JSONL rows)."""
        entry = task.metadata.get("entry")
        meta = entry.get("metadata") if isinstance(entry, Mapping) else None
        expression = meta.get("expression") if isinstance(meta, Mapping) else None
        if (
            "python" not in self.tools
            or not isinstance(expression, str)
            or task.answer is None
            or self.max_turns < 2
        ):
            return None
        code = json.dumps({"code": f"print({expression.strip()})"})
        call = {
            "id": "call_0",
            "type": "function",
            "function": {"name": "python", "arguments": code},
        }
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "assistant", "content": f"\\boxed{{{task.answer}}}"},
        ]

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        entry = task.metadata.get("entry")
        use_logic = self.verifier == "reasoning_gym" or (
            self.verifier == "auto"
            and isinstance(entry, Mapping)
            and task.metadata.get("dataset") not in NUMERIC_DATASETS
        )
        if use_logic:
            if not isinstance(entry, Mapping):
                raise ConfigError(f"task {task.id!r} has no reasoning-gym entry to verify against")
            result = self.logic_reward(submission, entry)
        else:
            if task.answer is None:
                raise ConfigError(f"task {task.id!r} has no answer")
            result = self.math_reward(submission, str(task.answer))
        return Score(result.reward, result.to_details())

    def teardown(self) -> None:
        self.sandbox.close()
