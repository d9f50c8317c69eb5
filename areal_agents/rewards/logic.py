r"""Puzzles and logic tasks scored by the verifiers that ``reasoning-gym`` ships.

Many reasoning-gym tasks have several valid answers (a propositional-logic conclusion, a
sudoku with more than one completion, a countdown expression): comparing with the one stored
answer would be wrong, so :class:`ReasoningGymReward` calls the dataset's own
``score_answer(answer, entry)``. Any reasoning-gym dataset works with no new code.

>>> import reasoning_gym
>>> entry = reasoning_gym.create_dataset("knights_knaves", size=1, seed=3)[0]
>>> reward = ReasoningGymReward()
>>> reward(f"<answer>{entry['answer']}</answer>", entry).status
'correct'
>>> reward("<answer>nobody</answer>", entry).reward
0.0
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from areal_agents.errors import DependencyError, InfrastructureError
from areal_agents.rewards._safe_text import error_text
from areal_agents.rewards.base import (
    Reward,
    RewardResult,
    RewardTimeout,
    check_timeout,
)
from areal_agents.rewards.extract import extract_answer
from areal_agents.rewards.isolation import run_isolated, warm_up

__all__ = ["ReasoningGymReward", "reasoning_gym_scorer", "score_with_reasoning_gym"]


@functools.cache
def reasoning_gym_scorer(dataset: str) -> Callable[[str | None, dict[str, Any]], float]:
    """reasoning-gym's ``score_answer`` for the named dataset (cached)."""
    try:
        import reasoning_gym
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise DependencyError.missing("reasoning-gym", "train") from e
    return reasoning_gym.get_score_answer_fn(dataset)  # type: ignore[return-value,unused-ignore]


def score_with_reasoning_gym(dataset: str, answer: str, entry: dict[str, Any]) -> float:
    """``score_answer(answer, entry)`` of ``dataset``'s verifier (what a grading process runs)."""
    return float(reasoning_gym_scorer(dataset)(answer, entry))


@warm_up
def _import_reasoning_gym() -> None:
    import reasoning_gym  # noqa: F401  (seconds of imports, paid once in the zygote)


class ReasoningGymReward(Reward):
    r"""Score with the reasoning-gym verifier of the entry's ``source_dataset``.

    ``reference`` is a reasoning-gym entry (``question``, ``answer``, ``metadata`` with
    ``source_dataset``). The answer is the last ``<answer>`` tag, else ``\boxed{}``, else the
    whole response (``fallback_to_text=False`` makes that ``no_answer``). The verifier runs in
    a grading process killed after ``timeout_s`` (status ``"timeout"``); an answer it cannot
    survive gets status ``"error"``.
    """

    def __init__(self, *, timeout_s: float = 10.0, fallback_to_text: bool = True) -> None:
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self.acall_slack_s = 5.0  # the synchronous call enforces timeout_s itself
        self.fallback_to_text = fallback_to_text

    def __call__(self, response: str, reference: Any) -> RewardResult:
        if not isinstance(reference, Mapping):
            raise TypeError("ReasoningGymReward needs the reasoning-gym entry as reference")
        entry = dict(reference)
        dataset = (entry.get("metadata") or {}).get("source_dataset")
        if not isinstance(dataset, str):
            raise ValueError("reasoning-gym entry has no metadata['source_dataset']")
        answer = extract_answer(response, fallback_to_text=self.fallback_to_text)
        if answer is None:
            return RewardResult(0.0, "no_answer")
        reasoning_gym_scorer(dataset)  # an unknown dataset fails here, as a configuration error
        try:
            value = run_isolated(
                score_with_reasoning_gym, dataset, answer, entry, timeout_s=self.timeout_s
            )
        except RewardTimeout:
            return self.timed_out(f"reasoning-gym {dataset} verifier")
        except InfrastructureError:
            raise
        except Exception as e:  # GradingFailed, or the verifier raised on this answer
            details = {"answer": answer, "dataset": dataset, "error": error_text(e)}
            return RewardResult(0.0, "error", details)
        if not math.isfinite(value):
            return RewardResult(0.0, "error", {"answer": answer, "dataset": dataset})
        status = "correct" if value >= 1.0 else "wrong" if value <= 0.0 else "partial"
        return RewardResult(value, status, {"answer": answer, "dataset": dataset})
