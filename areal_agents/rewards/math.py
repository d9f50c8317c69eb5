r"""Math answers compared by symbolic equivalence (``math-verify``), not by string.

The final answer is the last ``\boxed{...}`` of the response (an ``<answer>`` tag also works).
Gold and answer are parsed by ``math-verify`` as LaTeX and as plain expressions, then compared
with sympy: ``\frac{1}{2}``, ``0.5``, ``2/4`` and ``\dfrac12`` are the same answer.

Parsing and comparing run in a grading process
(:func:`~areal_agents.rewards.isolation.run_isolated`) that is killed when ``timeout_s``
passes: sympy can hold the GIL for minutes on one answer (``\boxed{9^{9^{9}}}``), so a
thread-based limit would never fire. ``math-verify``'s own signal-based limit is switched off
(it works only in a main thread).

>>> reward = MathEquivalence()
>>> reward(r"... so the answer is \boxed{\dfrac{2}{4}}", "0.5").status
'correct'
>>> reward("I am not sure", "0.5").status
'no_answer'
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from areal_agents.errors import DependencyError
from areal_agents.rewards.base import Reward, RewardResult, RewardTimeout, check_timeout
from areal_agents.rewards.extract import extract_answer_tag, extract_boxed
from areal_agents.rewards.isolation import GradingFailed, run_isolated, warm_up

__all__ = ["MathEquivalence", "math_equal"]

_MAX_ANSWER_CHARS = 1000


class _DropTimeoutNotice(logging.Filter):
    """math-verify warns on every call made without its signal timeout; we bound time ourselves."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@functools.cache
def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise DependencyError.missing("math-verify", "train") from e
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutNotice())
    return math_verify


def _as_latex(text: str) -> str:
    text = text.strip()
    if text.startswith("$") or text.startswith("\\(") or text.startswith("\\["):
        return text
    return f"${text}$"


def math_equal(answer: str, gold: str | float | int) -> bool:
    """Whether ``answer`` and ``gold`` are the same mathematical object (no time limit)."""
    mv = _math_verify()
    gold_parsed = mv.parse(_as_latex(str(gold)), parsing_timeout=None)
    if not gold_parsed:
        raise ValueError(f"math-verify cannot parse the gold answer {gold!r}")
    answer_parsed = mv.parse(_as_latex(answer), parsing_timeout=None)
    if not answer_parsed:
        return False
    return bool(mv.verify(gold_parsed, answer_parsed, timeout_seconds=None))


@warm_up
def _build_parsers() -> None:
    # math-verify builds its LaTeX parser and regexes on first use: pay that in the zygote
    for answer, gold in ((r"\frac{1}{2}", "0.5"), ("x^2+1", "1+x^2"), ("3", "3")):
        math_equal(answer, gold)


class MathEquivalence(Reward):
    r"""1.0 when the boxed answer equals the gold answer symbolically, else 0.0.

    Args:
        timeout_s: limit for parsing and comparing one answer (status ``"timeout"`` past it;
            the grading process is killed). An answer the grader cannot survive (it runs out
            of memory or crashes) gets status ``"error"``.
        require_boxed: when False, a response with neither ``\boxed{}`` nor ``<answer>`` is
            taken whole as the answer instead of scoring ``no_answer``.
    """

    def __init__(self, *, timeout_s: float = 10.0, require_boxed: bool = True) -> None:
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self.acall_slack_s = 5.0  # the synchronous call enforces timeout_s itself
        self.require_boxed = require_boxed

    def __call__(self, response: str, reference: Any) -> RewardResult:
        if isinstance(reference, dict):
            reference = reference.get("answer")
        if reference is None:
            raise ValueError("MathEquivalence needs a gold answer")
        answer = extract_boxed(response)
        if answer is None:
            answer = extract_answer_tag(response)
        if answer is None and not self.require_boxed and response.strip():
            answer = response.strip()
        if answer is None or not answer:
            return RewardResult(0.0, "no_answer")
        if len(answer) > _MAX_ANSWER_CHARS:
            return RewardResult(0.0, "format_error", {"error": "answer too long"})
        try:
            equal = run_isolated(math_equal, answer, reference, timeout_s=self.timeout_s)
        except RewardTimeout:
            return self.timed_out("math-verify")
        except GradingFailed as e:
            return RewardResult(0.0, "error", {"answer": answer, "error": str(e)})
        if equal:
            return RewardResult(1.0, "correct", {"answer": answer})
        return RewardResult(0.0, "wrong", {"answer": answer})
