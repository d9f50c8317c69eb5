"""The reward contract: a plain callable ``reward(response, reference) -> RewardResult``.

A reward needs no environment: give it the model's final text and whatever the task knows
(the gold answer, the hidden tests, a reasoning-gym entry) and it returns a
:class:`RewardResult` — the number, a ``status`` word that says *why* (``"correct"``,
``"wrong"``, ``"no_answer"``, ``"timeout"``, ...) and a few JSON-able details. ``float(result)``
is the reward, so a result can stand wherever a float is expected.

Time limits. A reward that runs model-written text through a parser (sympy, a verifier, a
regular expression) runs that work in a grading process that is killed when its ``timeout_s``
passes (:mod:`areal_agents.rewards.isolation`): a thread cannot be stopped while a big-integer
power holds the GIL. The result is then status ``"timeout"``. Rewards that only do linear-time
text work (extraction, normalisation, exact match) run in the caller. Slow rewards also have
an async form, :meth:`Reward.acall`, that runs the check in a worker thread, so a coroutine
never blocks the event loop.

>>> from areal_agents.rewards import ExactMatch
>>> result = ExactMatch()("The Eiffel Tower", ["eiffel tower"])
>>> float(result), result.status
(1.0, 'correct')
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from areal_agents.config import check_timeout
from areal_agents.errors import RewardTimeout

__all__ = [
    "STATUSES",
    "FunctionReward",
    "Reward",
    "RewardResult",
    "RewardTimeout",
    "call_with_timeout",
    "check_timeout",
]

#: The status words rewards use. ``timeout`` is never folded into ``wrong``: a check that ran
#: out of time says so, so that a caller can tell a slow program from a wrong one.
STATUSES = (
    "correct",
    "partial",
    "wrong",
    "no_answer",
    "format_error",
    "timeout",
    "error",
)

T = TypeVar("T")


@dataclass(frozen=True)
class RewardResult:
    """The outcome of one reward call: the reward, why, and JSON-able details."""

    reward: float
    status: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __float__(self) -> float:
        return float(self.reward)

    def to_details(self) -> dict[str, Any]:
        """``{"reward": ..., "status": ..., **details}`` as one flat JSON-able dict."""
        return {"reward": self.reward, "status": self.status, **self.details}


class Reward:
    """Base class of the built-in rewards: subclasses implement :meth:`__call__`.

    ``timeout_s`` bounds :meth:`acall` (and, for rewards that run foreign code or a symbolic
    solver, the synchronous call too). A reward that runs out of time returns status
    ``"timeout"`` with reward ``timeout_reward`` (0.0 unless configured).
    """

    timeout_s: float = 30.0
    timeout_reward: float = 0.0
    #: extra seconds :meth:`acall` waits beyond ``timeout_s``, for rewards that enforce
    #: ``timeout_s`` themselves (a sandbox run) and report more than a bare timeout.
    acall_slack_s: float = 0.0

    def __call__(self, response: str, reference: Any) -> RewardResult:
        raise NotImplementedError

    def timed_out(self, what: str = "reward") -> RewardResult:
        """The result for a check that ran out of time."""
        return RewardResult(
            self.timeout_reward, "timeout", {"error": f"{what} exceeded {self.timeout_s:g} s"}
        )

    async def acall(self, response: str, reference: Any) -> RewardResult:
        """The reward computed in a worker thread, bounded by ``timeout_s``."""
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self, response, reference),
                timeout=self.timeout_s + self.acall_slack_s,
            )
        except TimeoutError:
            return self.timed_out(type(self).__name__)


class FunctionReward(Reward):
    """Wrap ``fn(response, reference) -> float | RewardResult`` as a :class:`Reward`.

    With ``isolate=True`` every call runs ``fn`` in a grading process killed after
    ``timeout_s`` (status ``"timeout"``); use it for any ``fn`` that parses model text with
    something that is not linear-time. ``fn`` must then be a module-level function.
    Otherwise ``fn`` runs in the caller and only :meth:`acall` is bounded (by waiting).

    >>> r = FunctionReward(lambda response, reference: float(len(response) < 10), name="short")
    >>> r("tiny", None)
    RewardResult(reward=1.0, status='correct', details={})
    """

    def __init__(
        self,
        fn: Callable[[str, Any], float | RewardResult],
        *,
        name: str | None = None,
        timeout_s: float = 30.0,
        isolate: bool = False,
    ) -> None:
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "reward"))
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self.isolate = isolate
        if isolate:
            from areal_agents.rewards._protocol import _reference

            _reference(fn)  # fails now, not at the first grade, when fn cannot be isolated
            self.acall_slack_s = 5.0

    def __call__(self, response: str, reference: Any) -> RewardResult:
        if self.isolate:
            from areal_agents.rewards.isolation import GradingFailed, run_isolated

            try:
                value = run_isolated(self.fn, response, reference, timeout_s=self.timeout_s)
            except RewardTimeout:
                return self.timed_out(self.name)
            except GradingFailed as e:
                return RewardResult(0.0, "error", {"error": str(e)})
        else:
            value = self.fn(response, reference)
        if isinstance(value, RewardResult):
            return value
        reward = float(value)
        status = "correct" if reward >= 1.0 else "wrong" if reward <= 0.0 else "partial"
        return RewardResult(reward, status)

    def __repr__(self) -> str:
        return f"FunctionReward({self.name})"


def call_with_timeout(fn: Callable[[], T], timeout_s: float) -> T:
    """Run ``fn()`` in a daemon thread and wait at most ``timeout_s`` for it.

    Raises :class:`RewardTimeout` when it does not finish in time; the thread is left to end on
    its own, because Python cannot kill a thread. That bounds only waits that release the GIL
    (I/O, sleeping, a subprocess): a computation that holds it (a sympy big-integer power, a
    backtracking regex) keeps running and stalls every other thread. Run those with
    :func:`~areal_agents.rewards.isolation.run_isolated` instead. Exceptions from ``fn``
    propagate.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="areal-reward")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RewardTimeout(f"did not finish within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return,unused-ignore]
