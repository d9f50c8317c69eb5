r"""The math grader against answers that explode or hedge (red team round 3, ``m1_math.py``).

Ported: 27 answers whose parsing or comparison explodes (factorials, towers, matrices, sums,
integrals, deep nesting) each come back within the time limit plus a margin, score nothing,
and leave no grading worker burning a CPU; and answers that might "equal everything" (a set,
an interval, a hedge, a sum with an infinite term) are accepted for at most one gold answer.
(The script's ``FAIL`` lines were its own ``ps``, a child of the script in state R.) New hedges
follow: ``\lor``, ``\pm``, ``\approx``, ``\equiv``, ``\mid``, cases, ``\cup``, text "or".
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from areal_agents.rewards import MathEquivalence
from areal_agents.rewards.isolation import default_pool, prewarm

LIMIT_S = 1.5
MARGIN_S = 2.5  # killing and reaping a worker, and a loaded CI machine
REWARD = MathEquivalence(timeout_s=LIMIT_S)

_MATRIX = r"\\".join("&".join(f"x_{{{i}{j}}}" for j in range(12)) for i in range(12))
BOMBS = {
    "factorial_latex": r"(10^{10})!",
    "factorial_nested": r"((100!)!)!",
    "factorial_plain": r"99999999!",
    "double_factorial": r"9999999!!",
    "binomial_huge": r"\binom{10^{12}}{10^{6}}",
    "nested_fractions": r"\frac{1}{" * 60 + "2" + "}" * 60,
    "nested_roots": r"\sqrt{" * 90 + "2" + "}" * 90,
    "nested_boxes": r"\boxed{" * 150 + "5" + "}" * 150,
    "power_tower": r"10^{10^{10^{10}}}",
    "negative_power_tower": r"(-1)^{9^{9^{9}}}",
    "matrix_inverse": r"\begin{pmatrix}" + _MATRIX + r"\end{pmatrix}^{-1}",
    "determinant_power": r"\det\begin{pmatrix}1&2\\3&4\end{pmatrix}^{99999999}",
    "sum_huge": r"\sum_{k=1}^{10^{9}} k^{k}",
    "product_huge": r"\prod_{k=1}^{10^{8}} k",
    "integral": r"\int_0^1 e^{x^{x^{x}}} dx",
    "limit": r"\lim_{n\to\infty} (1+1/n)^{n^{n}}",
    "float_digits": "1." + "1" * 900,
    "float_exponent": r"1e999999999",
    "unicode_lookalike": "５",
    "unicode_minus": "\u22125",
    "deep_parentheses": "(" * 400 + "5" + ")" * 400,
    "many_terms": "+".join(f"x^{{{i}}}" for i in range(150)),
    "gamma": r"\Gamma(10^{10})",
    "modular_tower": r"7^{7^{7^{7}}} \bmod 10",
    "expansion": r"(x+y+z+w)^{200}",
    "set_builder": r"\{x \mid x^{9^{9}} = 1\}",
    "interval_union": r"\cup".join(f"[{i},{i}.5]" for i in range(80)),
}


@pytest.fixture(scope="module", autouse=True)
def _warm_grader() -> None:
    prewarm(wait=True)
    assert REWARD(r"\boxed{5}", "5").reward == 1.0  # the pool is up and grades


@pytest.mark.parametrize("answer", list(BOMBS.values()), ids=list(BOMBS))
def test_an_exploding_answer_comes_back_in_time_with_nothing(answer: str) -> None:
    start = time.monotonic()
    result = REWARD(rf"\boxed{{{answer}}}", "7")
    assert result.reward == 0.0, result
    assert time.monotonic() - start < LIMIT_S + MARGIN_S


def _cpu_seconds_of_workers() -> float:
    """CPU time (user + system) of the default pool's workers, the zygote's children."""
    zygote = default_pool()._state["proc"].pid
    total = 0
    for pid in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == zygote:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_no_worker_keeps_burning_after_a_bomb() -> None:
    for name in ("power_tower", "factorial_plain", "expansion"):
        REWARD(rf"\boxed{{{BOMBS[name]}}}", "7")
    time.sleep(1.0)  # the zygote reaps the killed workers; a fresh spare warms up
    before = _cpu_seconds_of_workers()
    time.sleep(1.0)
    assert _cpu_seconds_of_workers() - before < 0.3


MAYBE_EVERYTHING = [
    r"\mathbb{R}", r"(-\infty, \infty)", "x", r"\text{any}", r"5 \text{ or } 6",
    "1,2,3,4,5,6,7,8,9,10", r"\pm 5", r"x = 5 \lor x = 6", r"\frac{0}{0}", r"0 \cdot \infty",
    r"\infty", r"\tilde\infty", "nan", r"5 \approx 6", "5 = 6", r"x \in \mathbb{R}",
    r"0.5, 5, x^2+1, \{1,2\}", r"\{5, \frac12, 1, 2\}", r"5 \le x \le 5", r"\text{5}", r"5\%",
    r"\$5", r"5 \text{ (wrong: 6)}", "4.9999999999", r"\frac{10}{2} + 0 \cdot 10^{10^{10}}",
    "x^2 + 1 = x^2+1", "(1,2)", "[1,2]", r"\{1,2\}", "1 < x",
]  # fmt: skip
NEW_HEDGES = [
    r"5 \vee 6", r"5 \;\text{and}\; 6", r"x \in \{5, 6\}", r"5 \pm 1", r"6 \approx 5",
    r"5 \ne 6", r"\{5, 6\}", r"5 \mid 6", "x=5, x=6", r"x = 5 \text{ or } x = 6",
    r"5 \lor 6", "6 = 5", r"5 \equiv 6", r"5 \sim 6", r"5 \leq x \leq 6", "[5, 6]",
    r"5 \\ 6", r"\begin{cases} 5 \\ 6 \end{cases}", "5 | 6", r"5 \cup 6", r"\{5\} \cup \{6\}",
    r"x_1 = 5, x_2 = 6", "x = 5; x = 6", r"5 \textbf{ or } 6",
]  # fmt: skip
# math-verify reads a tuple and the set of its elements as the same answer: one gold here
GOLDS = ["5", r"\frac{1}{2}", "x^2+1", "(1,2)", "6"]


@pytest.mark.parametrize("answer", MAYBE_EVERYTHING + NEW_HEDGES)
def test_no_answer_is_accepted_for_two_different_golds(answer: str) -> None:
    accepted = [gold for gold in GOLDS if REWARD(rf"\boxed{{{answer}}}", gold).reward > 0]
    assert len(accepted) <= 1, accepted


@pytest.mark.parametrize("answer", [r"x = 5 \lor x = 6", "5 = 6", r"5 \text{ or } 6"])
def test_a_hedge_scores_nothing_even_for_its_right_half(answer: str) -> None:
    assert REWARD(rf"\boxed{{{answer}}}", "6").reward == 0.0
