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
import re
from typing import Any

from areal_agents.errors import DependencyError, InfrastructureError
from areal_agents.rewards._safe_text import error_text
from areal_agents.rewards.base import (
    Reward,
    RewardResult,
    RewardTimeout,
    check_timeout,
)
from areal_agents.rewards.extract import extract_answer_tag, extract_boxed
from areal_agents.rewards.isolation import run_isolated, warm_up

__all__ = ["MathEquivalence", "math_answer_equal", "math_equal"]

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


# A hedge: several answers joined by "or"/"and" (``x = 5 \lor x = 6``) or a chain of equations
# whose sides differ (``5 = 6``). math-verify reads only the last one, so each part is graded.
_CONNECTIVE = re.compile(
    r"\\(?:lor|vee|land|wedge)(?![A-Za-z])"
    r"|\\(?:text|textrm|mathrm|mbox|textbf)\s*\{\s*(?:or|and)\s*\}"
    r"|(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])"
)
_NAME = re.compile(r"(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[A-Za-z0-9]+\}?)?(?:\([A-Za-z0-9_,\s]*\))?\Z")


def _split_equation(text: str) -> list[str]:
    """The sides of a chain ``a = b = c`` (an ``=`` outside any bracket, not part of ``<=``,
    ``>=``, ``!=`` or ``==``); ``[text]`` when it has none."""
    sides, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif ch == "=" and depth == 0:
            before = text[i - 1] if i else ""
            after = text[i + 1] if i + 1 < len(text) else ""
            if before in "<>!=" or after == "=":
                return [text]
            sides.append(text[start:i])
            start = i + 1
    sides.append(text[start:])
    return [s for s in (side.strip() for side in sides)]


def math_answer_equal(answer: str, gold: str | float | int) -> bool:
    r"""Whether ``answer`` is ``gold``, with no hedging: each part of ``x = 5 \lor x = 6`` and
    each side of ``5 = 6`` that is not a bare name (``x``, ``a_1``, ``f(x)``) must equal
    ``gold`` (unless ``gold`` itself is an equation or a compound statement). What the grading
    process runs for :class:`MathEquivalence`."""
    gold_text = str(gold)
    if "=" in gold_text or _CONNECTIVE.search(gold_text):
        return math_equal(answer, gold)
    pieces = [p.strip() for p in _CONNECTIVE.split(answer)]
    compared = 0
    for piece in pieces:
        for side in _split_equation(piece):
            if _NAME.match(side.replace(" ", "")):
                continue
            if not side or not math_equal(side, gold):
                return False
            compared += 1
    return compared > 0


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
            equal = run_isolated(math_answer_equal, answer, reference, timeout_s=self.timeout_s)
        except RewardTimeout:
            return self.timed_out("math-verify")
        except InfrastructureError:
            raise
        except Exception as e:  # GradingFailed, or the verifier's own error: never out of a step
            return RewardResult(0.0, "error", {"answer": answer, "error": error_text(e)})
        if equal:
            return RewardResult(1.0, "correct", {"answer": answer})
        return RewardResult(0.0, "wrong", {"answer": answer})
