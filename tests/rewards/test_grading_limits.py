"""Every grade comes back inside its time limit, whatever the answer (issue 12, item 2).

Answers whose evaluation explodes (towers of powers, huge factorials, giant fractions, deep
nesting, backtracking regular expressions) come back within ``timeout_s`` plus a small margin
with status ``timeout``; the pure-text steps around them (answer extraction, format checks)
are linear-time, so a huge reply cannot stall them either.
"""

from __future__ import annotations

import re
import time

import pytest
import reasoning_gym
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_agents.rewards import (
    F1,
    ExactMatch,
    MathEquivalence,
    ReasoningGymReward,
    RegexFormat,
    ThinkAnswerFormat,
    extract_answer_tag,
    extract_boxed,
    extract_code_blocks,
)
from areal_agents.rewards.isolation import prewarm

LIMIT_S = 1.5
MARGIN_S = 2.5  # killing and reaping a worker, and a loaded CI machine

BOMBS = {
    "tower 9^9^9": r"9^{9^{9}}",
    "tower 10^10^10": r"10^{10^{10}}",
    "tower 2^2^2^2^2^2": r"2^{2^{2^{2^{2^{2}}}}}",
    "factorial 10^8": r"100000000!",
    "factorial of a power": r"(10^{8})!",
    "giant fraction": r"\frac{10^{10^{8}}+1}{10^{10^{8}}}",
    "450 nested parentheses": "(" * 450 + "1" + ")" * 450,
}


@pytest.fixture(scope="module", autouse=True)
def _warm_grader() -> None:
    prewarm(wait=True)  # the one-off start of the grading process is not what is measured


@pytest.mark.parametrize("answer", list(BOMBS.values()), ids=list(BOMBS))
def test_exploding_math_answers_time_out_within_the_limit(answer: str) -> None:
    reward = MathEquivalence(timeout_s=LIMIT_S)
    start = time.monotonic()
    result = reward(f"The answer is \\boxed{{{answer}}}", "2")
    elapsed = time.monotonic() - start
    assert result.status == "timeout" and result.reward == 0.0, result
    assert elapsed < LIMIT_S + MARGIN_S, f"{elapsed:.1f} s"


def test_right_answers_still_score_one_between_bombs() -> None:
    reward = MathEquivalence(timeout_s=LIMIT_S)
    for bomb in (BOMBS["tower 9^9^9"], BOMBS["factorial 10^8"]):
        assert reward(f"\\boxed{{{bomb}}}", "2").status == "timeout"
        assert reward(r"\boxed{\frac{2}{4}}", "0.5").reward == 1.0
        assert reward(r"\boxed{0.51}", "0.5").status == "wrong"


def test_a_reasoning_gym_verifier_that_explodes_times_out() -> None:
    entry = reasoning_gym.create_dataset("simple_integration", size=1, seed=1)[0]
    reward = ReasoningGymReward(timeout_s=LIMIT_S)
    # the first reasoning-gym grade imports it in the grading process (not on the clock)
    assert reward(f"<answer>{entry['answer']}</answer>", entry).reward == 1.0
    start = time.monotonic()
    result = reward("<answer>9**9**9 + x</answer>", entry)  # sympy evaluates the power
    assert result.status == "timeout", result
    assert time.monotonic() - start < LIMIT_S + MARGIN_S
    assert reward(f"<answer>{entry['answer']}</answer>", entry).reward == 1.0


def test_a_backtracking_format_pattern_times_out() -> None:
    check = RegexFormat(r"^(a+)+$", timeout_s=LIMIT_S)  # exponential on a near-miss
    start = time.monotonic()
    assert check("a" * 40 + "!", None).status == "timeout"
    assert time.monotonic() - start < LIMIT_S + MARGIN_S
    assert check("aaaa", None).reward == 1.0
    assert check("aab", None).status == "format_error"


# ---- the text steps are linear-time (pytest-timeout fails a quadratic one) ---------------

HUGE = 400_000


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * HUGE,
        "<answer>" * HUGE,
        "```" + " " * HUGE,
        "```\n" * HUGE,
        "<think>" + "</think><answer></answer>x" * (HUGE // 8),
        " " * HUGE + "<answer>",
    ],
    ids=["unclosed boxed", "unclosed answer tags", "fence line of spaces", "fences", "think", "ws"],
)
def test_extraction_and_format_checks_are_linear_on_hostile_text(text: str) -> None:
    extract_boxed(text)
    extract_answer_tag(text)
    extract_code_blocks(text)
    assert ThinkAnswerFormat()(text, None).status == "format_error"
    ExactMatch()(text, "x")
    F1()(text, "x")


def test_extraction_finds_the_last_complete_answer() -> None:
    assert extract_boxed("\\boxed{1} \\boxed{2{3}} \\boxed{4") == "2{3}"
    assert extract_answer_tag("<ANSWER>a</answer> <answer>b</Answer> <answer>c") == "b"
    assert extract_code_blocks("```py extra\nx = 1\n```\n```bash\nls\n```\n```\ny") == [
        "x = 1",
        "y",
    ]
    assert ThinkAnswerFormat().check(" <think>a</think>\n<answer>b</answer>\n")
    assert ThinkAnswerFormat().check("<think></think><answer></answer>")
    assert not ThinkAnswerFormat().check("<think>a</think>x<answer>b</answer>")
    assert not ThinkAnswerFormat().check("<think>a</think><answer>b</answer>x")


# ---- same answers as the regular expressions they replace (on inputs small enough) ---------

_OLD_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OLD_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_OLD_THINK = re.compile(
    r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL | re.IGNORECASE
)


def _old_boxed(text: str) -> str | None:
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def _old_blocks(text: str) -> list[str]:
    tags = {"", "python", "py", "python3"}
    return [m.group(2).rstrip() for m in _OLD_FENCE.finditer(text) if m.group(1).lower() in tags]


_PIECES = st.sampled_from(
    [
        "\\boxed{", "\\fbox {", "{", "}", "<answer>", "</answer>", "<ANSWER>", "</Answer>",
        "<think>", "</think>", "```", "```python", "```bash x", "\n", " ", "\t", "a", "1",
    ]
)  # fmt: skip


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(st.lists(_PIECES, max_size=30).map("".join))
def test_linear_extraction_agrees_with_the_old_regexes(text: str) -> None:
    assert extract_boxed(text) == _old_boxed(text)
    found = _OLD_TAG.findall(text)
    assert extract_answer_tag(text) == (found[-1].strip() if found else None)
    assert extract_code_blocks(text) == _old_blocks(text)
    assert ThinkAnswerFormat().check(text) == bool(_OLD_THINK.match(text))


@settings(
    max_examples=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.text(max_size=200))
def test_math_reward_never_raises_on_any_text(text: str) -> None:
    result = MathEquivalence(timeout_s=5)(f"\\boxed{{{text}}}", "1")
    assert result.status in {"correct", "wrong", "no_answer", "format_error", "timeout", "error"}
