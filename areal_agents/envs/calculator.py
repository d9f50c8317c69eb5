"""A toy arithmetic environment with a calculator tool; needs no sandbox.

It exists so the multi-turn loop (tool call -> result -> final answer) can be exercised end to
end in milliseconds, by tests and by anyone reading the code for the first time.

>>> import json
>>> env = CalculatorEnv()
>>> obs, info = env.reset(seed=0)
>>> info["tools"][0]["function"]["name"]
'calculator'
>>> expression = env.task.metadata["expression"]
>>> call = {"name": "calculator", "arguments": {"expression": expression}}
>>> obs, r, term, trunc, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
>>> obs[0]["content"] == str(env.task.answer)
True
>>> env.step(f"The answer is \\\\boxed{{{obs[0]['content']}}}")[1:3]
(1.0, True)
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from areal_agents.envs._checks import check_int
from areal_agents.envs.base import MultiTurnEnv, Score, Task
from areal_agents.errors import ToolError
from areal_agents.rewards.extract import extract_answer_tag, extract_boxed
from areal_agents.tools.base import FunctionTool, Tool
from areal_agents.types import Turn

__all__ = ["CalculatorEnv", "extract_final_answer", "safe_eval"]

_BINOPS: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def safe_eval(expression: str) -> int:
    """Evaluate integer arithmetic (+ - * // % and parentheses); anything else is a ToolError."""
    if len(expression) > 200:
        raise ToolError("expression too long (200 characters at most)")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse expression: {e.msg}") from None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0:
                raise ToolError("division by zero")
            return int(_BINOPS[type(node.op)](left, right))
        raise ToolError(f"unsupported syntax: {ast.dump(node)[:60]}")

    return ev(tree)


def extract_final_answer(text: str) -> str | None:
    """The last ``\\boxed{...}`` or ``<answer>...</answer>`` in ``text``; None if neither."""
    boxed = extract_boxed(text)
    return boxed if boxed is not None else extract_answer_tag(text)


class CalculatorEnv(MultiTurnEnv):
    """Compute an arithmetic expression; a ``calculator`` tool is available.

    Reward 1.0 when the final answer (``\\boxed{N}`` or ``<answer>N</answer>``) equals the value,
    else 0.0. Tasks are drawn from the seeded generator, or given as
    ``options={"task": {"id": ..., "prompt": ..., "answer": ...}}``.
    """

    default_system_prompt: ClassVar[str | None] = (
        "You are a careful assistant. Use the calculator tool for arithmetic, then give the "
        "final answer as \\boxed{N}."
    )

    def __init__(self, *, num_operands: int = 3, max_value: int = 99, **kwargs: Any) -> None:
        self.num_operands = check_int("num_operands", num_operands, minimum=1)
        self.max_value = check_int("max_value", max_value, minimum=2)
        super().__init__(**kwargs)

    def make_tools(self, task: Task | None) -> Sequence[Tool]:
        return (
            FunctionTool(
                lambda expression: str(safe_eval(expression)),
                name="calculator",
                description="Evaluate an integer arithmetic expression (+, -, *, //, %).",
                parameters={
                    "type": "object",
                    "properties": {"expression": {"type": "string"}},
                    "required": ["expression"],
                    "additionalProperties": False,
                },
            ),
        )

    def sample_task(self, rng: np.random.Generator) -> Task:
        numbers = [int(n) for n in rng.integers(2, self.max_value + 1, size=self.num_operands)]
        ops = [str(o) for o in rng.choice(["+", "-", "*"], size=self.num_operands - 1)]
        expression = str(numbers[0])
        for op, n in zip(ops, numbers[1:], strict=True):
            expression += f" {op} {n}"
        value = safe_eval(expression)
        return Task(
            id=f"calc-{expression.replace(' ', '')}",
            prompt=f"What is {expression}?",
            answer=value,
            metadata={"expression": expression},
        )

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        answer = extract_final_answer(submission)
        if answer is None:
            return Score(0.0, {"format_ok": False})
        try:
            correct = int(answer.replace(",", "")) == int(task.answer)
        except ValueError:
            correct = False
        return Score(1.0 if correct else 0.0, {"format_ok": True, "answer": answer})
