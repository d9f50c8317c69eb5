r"""Composition of rewards: weighted sums and format gates.

>>> from areal_agents.rewards import BoxedFormat, ExactMatch
>>> total = WeightedSum([(ExactMatch(), 1.0), (BoxedFormat(), 0.1)])
>>> total(r"\boxed{Paris}", "paris").reward
1.1
>>> gated = FormatGate(BoxedFormat(), ExactMatch(), penalty=-0.5)
>>> gated("Paris", "paris").to_details()
{'reward': -0.5, 'status': 'format_error', 'expected': 'a final answer in \\boxed{}'}
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from areal_agents.rewards.base import Reward, RewardResult

__all__ = ["FormatGate", "WeightedSum", "combine"]


def _name(reward: Reward, index: int) -> str:
    return f"{index}_{getattr(reward, 'name', type(reward).__name__)}"


class WeightedSum(Reward):
    """``sum(weight * reward)`` over components; each component's result is in the details.

    The status is the first component's (the main reward), except that any component's
    ``timeout`` or ``error`` wins, so that a timeout is never hidden inside a sum.
    """

    def __init__(self, components: Sequence[tuple[Reward, float]]) -> None:
        if not components:
            raise ValueError("WeightedSum needs at least one (reward, weight) pair")
        self.components = [(r, float(w)) for r, w in components]
        self.timeout_s = max(r.timeout_s for r, _ in self.components)

    def _combine(self, results: Sequence[RewardResult]) -> RewardResult:
        return combine(
            [
                (_name(reward, i), result, weight)
                for i, ((reward, weight), result) in enumerate(
                    zip(self.components, results, strict=True)
                )
            ]
        )

    def __call__(self, response: str, reference: Any) -> RewardResult:
        return self._combine([r(response, reference) for r, _ in self.components])

    async def acall(self, response: str, reference: Any) -> RewardResult:
        results = await asyncio.gather(*(r.acall(response, reference) for r, _ in self.components))
        return self._combine(results)


def combine(parts: Sequence[tuple[str, RewardResult, float]]) -> RewardResult:
    """``(name, result, weight)`` results already computed, summed as :class:`WeightedSum` sums
    its components (its status rule, each part's result under ``details["components"][name]``).
    An environment that adds a reward to its own score uses it (``MultiTurnEnv(judge=...)``).

    >>> combine([("program", RewardResult(1.0, "correct"), 1.0),
    ...          ("judge", RewardResult(0.5, "partial"), 2.0)]).reward
    2.0
    """
    if not parts:
        raise ValueError("combine needs at least one (name, result, weight)")
    total = sum(weight * result.reward for _, result, weight in parts)
    status = parts[0][1].status
    for _, result, _ in parts:
        if result.status in ("timeout", "error"):
            status = result.status
            break
    components = {name: result.to_details() for name, result, _ in parts}
    return RewardResult(round(total, 10), status, {"components": components})


class FormatGate(Reward):
    """``reward`` when ``gate`` passes (reward >= 1), else ``penalty`` with status
    ``format_error``; the inner reward is not computed when the gate fails."""

    def __init__(self, gate: Reward, reward: Reward, *, penalty: float = 0.0) -> None:
        self.gate = gate
        self.reward = reward
        self.penalty = penalty
        self.timeout_s = reward.timeout_s

    def _failed(self, gate: RewardResult) -> RewardResult | None:
        if gate.reward >= 1.0:
            return None
        return RewardResult(self.penalty, "format_error", dict(gate.details))

    def __call__(self, response: str, reference: Any) -> RewardResult:
        failed = self._failed(self.gate(response, reference))
        return failed if failed is not None else self.reward(response, reference)

    async def acall(self, response: str, reference: Any) -> RewardResult:
        failed = self._failed(await self.gate.acall(response, reference))
        return failed if failed is not None else await self.reward.acall(response, reference)
