"""Reward functions usable inside and outside environments.

A reward is a plain callable ``reward(response, reference) -> RewardResult``; ``float(result)``
is the number and ``result.status`` says why (``correct``, ``wrong``, ``timeout``, ...). Slow
rewards also have ``await reward.acall(response, reference)``, run off the event loop with a
time limit. Rewards that parse model text (math, reasoning-gym, regular expressions) do it in
a grading process killed at the time limit (:mod:`areal_agents.rewards.isolation`).
"""

from areal_agents.rewards.base import (
    STATUSES,
    FunctionReward,
    Reward,
    RewardResult,
    RewardTimeout,
    call_with_timeout,
    check_timeout,
)
from areal_agents.rewards.code import (
    TestReport,
    UnitTestReward,
    UnitTests,
    assemble_program,
    run_unit_tests,
    select_code,
)
from areal_agents.rewards.compose import FormatGate, WeightedSum
from areal_agents.rewards.extract import (
    extract_answer,
    extract_answer_tag,
    extract_boxed,
    extract_code,
    extract_code_blocks,
)
from areal_agents.rewards.format import (
    AnswerTagFormat,
    BoxedFormat,
    CodeBlockFormat,
    FormatCheck,
    RegexFormat,
    ThinkAnswerFormat,
)
from areal_agents.rewards.isolation import (
    GraderPool,
    GraderUnavailable,
    GradingFailed,
    run_isolated,
)
from areal_agents.rewards.logic import (
    ReasoningGymReward,
    reasoning_gym_scorer,
    score_with_reasoning_gym,
)
from areal_agents.rewards.math import MathEquivalence, math_equal
from areal_agents.rewards.text import (
    F1,
    ExactMatch,
    exact_match,
    f1_score,
    gold_answers,
    normalize_answer,
)

__all__ = [
    "F1",
    "STATUSES",
    "AnswerTagFormat",
    "BoxedFormat",
    "CodeBlockFormat",
    "ExactMatch",
    "FormatCheck",
    "FormatGate",
    "FunctionReward",
    "GraderPool",
    "GraderUnavailable",
    "GradingFailed",
    "MathEquivalence",
    "ReasoningGymReward",
    "RegexFormat",
    "Reward",
    "RewardResult",
    "RewardTimeout",
    "TestReport",
    "ThinkAnswerFormat",
    "UnitTestReward",
    "UnitTests",
    "WeightedSum",
    "assemble_program",
    "call_with_timeout",
    "check_timeout",
    "exact_match",
    "extract_answer",
    "extract_answer_tag",
    "extract_boxed",
    "extract_code",
    "extract_code_blocks",
    "f1_score",
    "gold_answers",
    "math_equal",
    "normalize_answer",
    "reasoning_gym_scorer",
    "run_isolated",
    "run_unit_tests",
    "score_with_reasoning_gym",
    "select_code",
]
