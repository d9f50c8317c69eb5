r"""Format checks: does the response have the shape the task asks for?

Each check is a :class:`~areal_agents.rewards.base.Reward` that ignores the reference and
returns 1.0 (status ``"correct"``) or 0.0 (status ``"format_error"``), so it can be used alone,
in a :class:`~areal_agents.rewards.compose.WeightedSum`, or as the gate of a
:class:`~areal_agents.rewards.compose.FormatGate`.

>>> BoxedFormat()(r"so \boxed{4}", None).reward
1.0
>>> ThinkAnswerFormat()("<think>2+2</think> <answer>4</answer>", None).reward
1.0
>>> RegexFormat(r"^Answer: \d+$")("Answer: forty", None).status
'format_error'
"""

from __future__ import annotations

import re
from typing import Any

from areal_agents.rewards.base import Reward, RewardResult
from areal_agents.rewards.extract import extract_answer_tag, extract_boxed, extract_code

__all__ = [
    "AnswerTagFormat",
    "BoxedFormat",
    "CodeBlockFormat",
    "FormatCheck",
    "RegexFormat",
    "ThinkAnswerFormat",
]

_THINK_ANSWER = re.compile(
    r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL | re.IGNORECASE
)


class FormatCheck(Reward):
    """Base of the format checks: subclasses implement :meth:`check` and name the shape."""

    description = "the expected format"

    def check(self, response: str) -> bool:
        raise NotImplementedError

    def __call__(self, response: str, reference: Any = None) -> RewardResult:
        if self.check(response):
            return RewardResult(1.0, "correct")
        return RewardResult(0.0, "format_error", {"expected": self.description})


class BoxedFormat(FormatCheck):
    r"""The response contains a non-empty ``\boxed{...}``."""

    description = r"a final answer in \boxed{}"

    def check(self, response: str) -> bool:
        return bool(extract_boxed(response))


class AnswerTagFormat(FormatCheck):
    """The response contains a non-empty ``<answer>...</answer>``."""

    description = "a final answer in <answer></answer>"

    def check(self, response: str) -> bool:
        return bool(extract_answer_tag(response))


class CodeBlockFormat(FormatCheck):
    """The response contains a fenced Python code block."""

    description = "a fenced ```python code block"

    def check(self, response: str) -> bool:
        return extract_code(response) is not None


class ThinkAnswerFormat(FormatCheck):
    """The response is exactly ``<think>...</think>`` followed by ``<answer>...</answer>``."""

    description = "<think>...</think><answer>...</answer>"

    def check(self, response: str) -> bool:
        return bool(_THINK_ANSWER.match(response))


class RegexFormat(FormatCheck):
    """The response matches ``pattern`` (``re.search``; anchor it for a full match)."""

    def __init__(self, pattern: str, flags: int = re.DOTALL) -> None:
        self.pattern = re.compile(pattern, flags)
        self.description = f"text matching {pattern!r}"

    def check(self, response: str) -> bool:
        return self.pattern.search(response) is not None
