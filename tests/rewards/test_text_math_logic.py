"""Answer-matching rewards: exact match/F1 after normalisation, math-verify equivalence,
reasoning-gym verifiers, format checks and composition."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import reasoning_gym

from areal_agents.rewards import (
    F1,
    AnswerTagFormat,
    BoxedFormat,
    CodeBlockFormat,
    ExactMatch,
    FormatGate,
    FunctionReward,
    MathEquivalence,
    ReasoningGymReward,
    RegexFormat,
    RewardResult,
    RewardTimeout,
    ThinkAnswerFormat,
    WeightedSum,
    call_with_timeout,
    exact_match,
    extract_boxed,
    f1_score,
    normalize_answer,
)

# ---- exact match / F1 -----------------------------------------------------------------------


def test_normalisation_drops_case_punctuation_articles_and_spaces() -> None:
    assert normalize_answer("  The Kelmarth, river!  ") == "kelmarth river"
    assert exact_match("an apple", "Apple.") == 1.0
    assert exact_match("apples", "apple") == 0.0


def test_exact_match_accepts_any_gold_answer_and_mapping_references() -> None:
    assert exact_match("NYC", ["New York City", "nyc"]) == 1.0
    assert ExactMatch()("<answer>nyc</answer>", {"golden_answers": ["NYC"]}).reward == 1.0


def test_f1_is_token_overlap_and_best_over_golds() -> None:
    assert f1_score("Lake Varnu", "Lake Varnu") == 1.0
    assert f1_score("Varnu", "Lake Varnu") == pytest.approx(2 / 3)
    assert f1_score("Varnu", ["Osk", "Lake Varnu"]) == pytest.approx(2 / 3)
    assert f1_score("Osk", "Lake Varnu") == 0.0
    result = F1()("<answer>the lake Varnu region</answer>", "Lake Varnu")
    assert result.status == "partial" and 0 < result.reward < 1


def test_text_reward_statuses_and_extraction() -> None:
    em = ExactMatch(fallback_to_text=False)
    assert em("Paris", "Paris").status == "no_answer"  # no tag and fallback disabled
    assert em(r"\boxed{Paris}", "paris").status == "correct"
    assert em("<answer>Rome</answer>", "paris").to_details() == {
        "reward": 0.0,
        "status": "wrong",
        "answer": "Rome",
    }
    assert ExactMatch()("Paris", "paris").reward == 1.0  # whole text when there is no tag


# ---- math-verify -----------------------------------------------------------------------------

EQUIVALENT = [
    (r"\boxed{\frac{1}{2}}", "0.5"),
    (r"\boxed{0.5}", r"\frac{1}{2}"),
    (r"\boxed{2/4}", "1/2"),
    (r"\boxed{\dfrac12}", "0.5"),
    (r"The total is \boxed{288}.", "288"),
    (r"\boxed{288.0}", "288"),
    (r"\boxed{1,000}", "1000"),
    (r"\boxed{-\frac{6}{4}}", "-1.5"),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}"),
    (r"\boxed{x^2+2x+1}", "(x+1)^2"),
    (r"\boxed{\pi/2}", r"\frac{\pi}{2}"),
    ("<answer>3/4</answer>", "0.75"),
]


@pytest.mark.parametrize(("response", "gold"), EQUIVALENT)
def test_equivalent_forms_score_one(response: str, gold: str) -> None:
    result = MathEquivalence()(response, gold)
    assert (result.reward, result.status) == (1.0, "correct"), result


@pytest.mark.parametrize(
    ("response", "gold"),
    [(r"\boxed{0.51}", "0.5"), (r"\boxed{289}", "288"), (r"\boxed{x^2+1}", "(x+1)^2")],
)
def test_different_values_score_zero(response: str, gold: str) -> None:
    assert MathEquivalence()(response, gold).status == "wrong"


def test_math_needs_a_boxed_answer_unless_told_otherwise() -> None:
    assert MathEquivalence()("the answer is 288", "288").status == "no_answer"
    assert MathEquivalence(require_boxed=False)("288", "288").status == "correct"
    assert extract_boxed(r"\boxed{\frac{a}{b}} then \boxed{\sqrt{x^{2}}}") == r"\sqrt{x^{2}}"


def test_math_reward_works_in_worker_threads_and_async() -> None:
    reward = MathEquivalence()
    out: list[RewardResult] = []
    thread = threading.Thread(target=lambda: out.append(reward(r"\boxed{0.25}", "1/4")))
    thread.start()
    thread.join(30)
    assert out and out[0].status == "correct"
    assert asyncio.run(reward.acall(r"\boxed{3}", "3")).reward == 1.0


def test_slow_checks_are_reported_as_timeouts_not_wrong() -> None:
    def slow(response: str, reference: object) -> float:
        time.sleep(2)
        return 1.0

    reward = FunctionReward(slow, timeout_s=0.2)
    result = asyncio.run(reward.acall("x", None))
    assert result.status == "timeout" and result.reward == 0.0
    with pytest.raises(RewardTimeout):
        call_with_timeout(lambda: time.sleep(2), 0.1)
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 5)


# ---- reasoning-gym verifiers -----------------------------------------------------------------


def test_reasoning_gym_verifier_scores_logic_puzzles() -> None:
    entry = reasoning_gym.create_dataset("knights_knaves", size=1, seed=11)[0]
    reward = ReasoningGymReward()
    assert reward(f"<answer>{entry['answer']}</answer>", entry).status == "correct"
    terms = entry["metadata"]["knight_knave_terms"]
    good, bad = terms["knight"], terms["knave"]
    flipped = entry["answer"].replace(good, "@").replace(bad, good).replace("@", bad)
    assert flipped != entry["answer"]
    assert reward(f"<answer>{flipped}</answer>", entry).reward < 1.0


def test_reasoning_gym_verifier_accepts_any_valid_answer_not_just_the_stored_one() -> None:
    # propositional_logic stores no single answer: its verifier checks the conclusion itself.
    entry = reasoning_gym.create_dataset("propositional_logic", size=1, seed=3)[0]
    assert entry["answer"] is None
    premise = entry["metadata"]["premises"][1]
    assert ReasoningGymReward()(f"<answer>{premise}</answer>", entry).reward == 1.0


# ---- format checks and composition -----------------------------------------------------------


def test_format_checks() -> None:
    assert BoxedFormat()(r"\boxed{}", None).status == "format_error"  # empty
    assert AnswerTagFormat()("<answer>x</answer>", None).reward == 1.0
    assert CodeBlockFormat()("```python\nx = 1\n```", None).reward == 1.0
    assert CodeBlockFormat()("```bash\nls\n```", None).reward == 0.0
    assert ThinkAnswerFormat()("<answer>4</answer>", None).reward == 0.0
    assert RegexFormat(r"^\d+$")("42", None).reward == 1.0


def test_weighted_sum_and_format_gate() -> None:
    total = WeightedSum([(MathEquivalence(), 1.0), (ThinkAnswerFormat(), 0.2)])
    good = total(r"<think>1+1</think><answer>\boxed{2}</answer>", "2")
    assert good.reward == pytest.approx(1.2)
    assert set(good.details["components"]) == {"0_MathEquivalence", "1_ThinkAnswerFormat"}
    assert total(r"\boxed{3}", "2").reward == 0.0
    gate = FormatGate(ThinkAnswerFormat(), MathEquivalence(), penalty=-1.0)
    assert gate(r"\boxed{2}", "2").to_details()["status"] == "format_error"
    assert gate(r"\boxed{2}", "2").reward == -1.0
    assert asyncio.run(gate.acall(r"<think>.</think><answer>\boxed{2}</answer>", "2")).reward == 1.0
    assert asyncio.run(total.acall(r"\boxed{2}", "2")).reward == 1.0


def test_weighted_sum_never_hides_a_timeout() -> None:
    slow = FunctionReward(lambda r, ref: RewardResult(0.0, "timeout"), name="slow")
    assert WeightedSum([(ExactMatch(), 1.0), (slow, 1.0)])("a", "a").status == "timeout"
