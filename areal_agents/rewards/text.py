"""Exact match and token F1 after SQuAD-style normalisation (lower case, no punctuation,
no articles, single spaces), against one gold answer or any of several.

>>> normalize_answer("The  Eiffel-Tower!")
'eiffeltower'
>>> exact_match("the eiffel tower", ["Eiffel Tower", "La tour Eiffel"])
1.0
>>> round(f1_score("Lake Varnu in Osterland", "Lake Varnu"), 3)
0.667
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from areal_agents.rewards.base import Reward, RewardResult
from areal_agents.rewards.extract import extract_answer

__all__ = ["F1", "ExactMatch", "exact_match", "f1_score", "gold_answers", "normalize_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse white space."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def gold_answers(reference: Any) -> list[str]:
    """The gold answers in ``reference``: a string, a list of strings, or a mapping with
    ``answer``/``answers``/``golden_answers``."""
    if isinstance(reference, dict):
        for key in ("golden_answers", "answers", "answer", "target"):
            if key in reference:
                return gold_answers(reference[key])
        raise ValueError(f"reference mapping has no answer key: {sorted(reference)}")
    if isinstance(reference, str):
        return [reference]
    if isinstance(reference, int | float):
        return [str(reference)]
    if isinstance(reference, Sequence):
        return [str(r) for r in reference]
    raise TypeError(f"reference must be a string or a list of strings, got {type(reference)}")


def exact_match(prediction: str, reference: Any) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in gold_answers(reference)))


def _f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, reference: Any) -> float:
    """The best token-level F1 between the prediction and any gold answer."""
    return max(_f1(prediction, g) for g in gold_answers(reference))


class _TextReward(Reward):
    metric: Callable[[str, Any], float]

    def __init__(
        self,
        *,
        extract: Callable[[str], str | None] | None = None,
        fallback_to_text: bool = True,
    ) -> None:
        self.extract = extract
        self.fallback_to_text = fallback_to_text

    def _answer(self, response: str) -> str | None:
        if self.extract is not None:
            return self.extract(response)
        return extract_answer(response, fallback_to_text=self.fallback_to_text)

    def __call__(self, response: str, reference: Any) -> RewardResult:
        answer = self._answer(response)
        if answer is None:
            return RewardResult(0.0, "no_answer")
        value = type(self).metric(answer, reference)
        status = "correct" if value >= 1.0 else "wrong" if value <= 0.0 else "partial"
        return RewardResult(value, status, {"answer": answer})


class ExactMatch(_TextReward):
    r"""Exact match after normalisation.

    The answer is the last ``<answer>`` tag or ``\boxed{}`` in the response; when there is
    neither, the whole response (``fallback_to_text=False`` makes that ``no_answer``). Pass
    ``extract`` to pull the answer out some other way.
    """

    metric = staticmethod(exact_match)


class F1(_TextReward):
    """Token F1 after normalisation (best over the gold answers); same extraction as ExactMatch."""

    metric = staticmethod(f1_score)
