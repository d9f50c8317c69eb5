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

from areal_agents.rewards.base import Reward, RewardResult, RewardTimeout, check_timeout
from areal_agents.rewards.extract import extract_answer_tag, extract_boxed, extract_code
from areal_agents.rewards.isolation import GradingFailed, run_isolated

__all__ = [
    "AnswerTagFormat",
    "BoxedFormat",
    "CodeBlockFormat",
    "FormatCheck",
    "RegexFormat",
    "ThinkAnswerFormat",
    "regex_search",
]

# ThinkAnswerFormat in linear time: the text (stripped) opens with <think>, ends with
# </answer>, and somewhere between has "</think>", white space, "<answer>".
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
_THINK_TO_ANSWER = re.compile(r"</think>\s*<answer>", re.IGNORECASE)


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
        text = response.strip()
        close = len(text) - len("</answer>")
        if not (_THINK_OPEN.match(text) and close >= 0 and _ANSWER_CLOSE.match(text, close)):
            return False
        # the earliest "</think> <answer>" after the opening tag leaves the most room
        middle = _THINK_TO_ANSWER.search(text, len("<think>"))
        return middle is not None and middle.end() <= close


def regex_search(pattern: str, flags: int, text: str) -> bool:
    """Whether ``re.search(pattern, text, flags)`` matches (what a grading process runs)."""
    return re.compile(pattern, flags).search(text) is not None


class RegexFormat(FormatCheck):
    """The response matches ``pattern`` (``re.search``; anchor it for a full match).

    A backtracking pattern can take exponential time on a crafted response, so the match runs
    in a grading process killed after ``timeout_s`` (status ``"timeout"``).
    """

    def __init__(self, pattern: str, flags: int = re.DOTALL, *, timeout_s: float = 5.0) -> None:
        self.pattern = re.compile(pattern, flags)  # a bad pattern fails here, not per grade
        self.description = f"text matching {pattern!r}"
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self.acall_slack_s = 5.0

    def check(self, response: str) -> bool:
        """The match (raises RewardTimeout when it runs out of time)."""
        return run_isolated(
            regex_search,
            self.pattern.pattern,
            self.pattern.flags,
            response,
            timeout_s=self.timeout_s,
        )

    def __call__(self, response: str, reference: Any = None) -> RewardResult:
        try:
            return super().__call__(response, reference)
        except RewardTimeout:
            return self.timed_out("the format pattern")
        except GradingFailed as e:
            return RewardResult(0.0, "error", {"error": str(e)})
