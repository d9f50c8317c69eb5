"""Benchmark workloads: a calculator dialogue whose length has a long tail.

Real agent episodes are short for most tasks and long for some. ``LongTailCalculator`` makes
that shape controllable: a task is a dialogue of ``k`` arithmetic questions asked one after the
other, each answered with a calculator call and a ``\\boxed{}`` answer (two assistant turns per
question). ``k`` is drawn per task from ``rounds``/``weights`` — by default 1 (55% of the tasks),
2 (25%), 4 or 8 (10% each) — so the longest episodes are ~3.6x the mean. The reward is the
fraction of questions answered correctly.

A question gets at most ``turns_per_question`` assistant turns (2: the call and the answer);
one that runs out of them scores 0 and the next question is asked. So an episode's length is
set by its task, at most ``turns_per_question x k`` turns, and a policy that talks on cannot
stretch one dialogue to the whole episode's turn limit: the async-vs-sync benchmark compares
modes by trained tokens per second, which is fair only when both train episodes of the same
lengths.

It is registered as ``benchmarks.workloads:LongTailCalculator-v0``: Gymnasium imports this
module on ``gym.make`` in every process (the repository root must be on ``PYTHONPATH``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from areal_agents.envs.base import Task
from areal_agents.envs.calculator import CalculatorEnv
from areal_agents.types import Message, Turn

__all__ = ["ENV_ID", "LongTailCalculator"]

ENV_ID = "benchmarks.workloads:LongTailCalculator-v0"


class LongTailCalculator(CalculatorEnv):
    """A dialogue of ``k`` calculator questions; ``k`` has a long-tailed distribution."""

    def __init__(
        self,
        *,
        rounds: Sequence[int] = (1, 2, 4, 8),
        weights: Sequence[float] = (0.55, 0.25, 0.10, 0.10),
        turns_per_question: int = 2,
        **kwargs: Any,
    ) -> None:
        if len(rounds) != len(weights) or min(rounds) < 1:
            raise ValueError("rounds and weights must have the same length; rounds >= 1")
        if turns_per_question < 1:
            raise ValueError(f"turns_per_question={turns_per_question}: must be at least 1")
        self.rounds = tuple(int(r) for r in rounds)
        self.weights = np.asarray(weights, dtype=float) / float(np.sum(weights))
        self.turns_per_question = int(turns_per_question)
        kwargs.setdefault("max_turns", self.turns_per_question * max(self.rounds))
        super().__init__(**kwargs)
        self._questions: list[Task] = []
        self._correct = 0
        self._question_turns = 0

    def sample_task(self, rng: np.random.Generator) -> Task:
        k = int(rng.choice(self.rounds, p=self.weights))
        questions = [super(LongTailCalculator, self).sample_task(rng) for _ in range(k)]
        first = questions[0]
        return Task(
            id="-".join(q.id for q in questions),
            prompt=first.prompt,
            answer=first.answer,
            metadata={
                "expression": first.metadata["expression"],
                "rounds": k,
                "questions": [(q.prompt, q.answer) for q in questions],
            },
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        assert self.task is not None
        pairs = self.task.metadata.get("questions") or [(self.task.prompt, self.task.answer)]
        self._questions = [
            Task(id=f"{self.task.id}#{i}", prompt=p, answer=a) for i, (p, a) in enumerate(pairs)
        ]
        self._correct = 0
        self._question_turns = 0
        info["rounds"] = len(self._questions)
        return obs, info

    def step(
        self, action: Turn | str | Any
    ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        self._question_turns += 1
        if terminated:  # the question was answered
            self._correct += int(reward > 0)
        elif self._question_turns < self.turns_per_question:
            return obs, reward, terminated, truncated, info  # (truncated at max_turns, or not)
        else:  # out of turns: the question scores 0
            info = {**info, "outcome": "out_of_turns"}
        self._question_turns = 0
        self._questions.pop(0)
        assert self.task is not None
        if not self._questions:  # the last question: the episode's reward is the accuracy
            asked = int(self.task.metadata.get("rounds", 1))
            self._done = True
            info["rounds_correct"] = self._correct
            return obs, self._correct / asked, True, False, info
        nxt = self._questions[0]
        self.task = Task(
            id=self.task.id, prompt=nxt.prompt, answer=nxt.answer, metadata=self.task.metadata
        )
        message = Message.user(nxt.prompt)
        self.messages.append(message)
        self._done = False
        if self._turns >= self.max_turns:
            self._done = True
            return [*obs, message.to_openai()], 0.0, False, True, self._info(outcome="max_turns")
        return [*obs, message.to_openai()], 0.0, False, False, self._info()


if ENV_ID.split(":", 1)[1] not in gym.registry:
    gym.register(id=ENV_ID.split(":", 1)[1], entry_point=LongTailCalculator)
