r"""Math (and logic) tasks: reasoning-gym's procedural generators and user JSONL.

reasoning-gym generates its tasks offline. A task id is ``rg/<dataset>/<seed>``, and the same
id always regenerates the same problem. The reasoning-gym entry (question, answer, metadata)
is kept in ``metadata["entry"]`` so that its own verifier can score puzzles with many valid
answers (see :class:`areal_agents.rewards.ReasoningGymReward`).

>>> source = ReasoningGymTasks(["basic_arithmetic"])
>>> task = source.sample(np.random.default_rng(0))
>>> task.id.startswith("rg/basic_arithmetic/"), source.get(task.id) == task
(True, True)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from areal_agents.envs.base import Task
from areal_agents.envs.tasks.base import ListTaskSource, read_jsonl
from areal_agents.errors import ConfigError, DependencyError, did_you_mean

__all__ = [
    "DEFAULT_MATH_DATASETS",
    "NUMERIC_DATASETS",
    "ReasoningGymTasks",
    "math_tasks_from_jsonl",
]

#: What ``MathPython-v0`` draws from by default: arithmetic and grade-school word problems.
DEFAULT_MATH_DATASETS = ("basic_arithmetic", "chain_sum", "gsm_symbolic")

#: reasoning-gym datasets whose answer is one number or expression (scored by math-verify);
#: for every other dataset the environment uses reasoning-gym's own verifier.
NUMERIC_DATASETS = frozenset(
    {
        "basic_arithmetic",
        "chain_sum",
        "decimal_arithmetic",
        "decimal_chain_sum",
        "fraction_simplification",
        "gcd",
        "gsm_symbolic",
        "lcm",
        "leg_counting",
        "power_function",
        "products",
        "simple_equations",
        "count_bits",
        "count_primes",
    }
)


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise DependencyError.missing("reasoning-gym", "train") from e
    return reasoning_gym


@functools.cache
def _known_datasets() -> tuple[str, ...]:
    return tuple(sorted(_reasoning_gym().factory.DATASETS))


def _plain(value: Any) -> Any:
    """A JSON-able copy (tuples become lists) of a reasoning-gym entry."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class ReasoningGymTasks:
    """Tasks drawn from reasoning-gym generators, uniformly over ``datasets``.

    Args:
        datasets: reasoning-gym dataset names (any of its ~100 generators).
        config: per-dataset generator options, e.g. ``{"basic_arithmetic": {"max_terms": 3}}``.
        answer_hint: appended to each question (says how to format the final answer).
    """

    def __init__(
        self,
        datasets: Sequence[str] = DEFAULT_MATH_DATASETS,
        *,
        config: Mapping[str, Mapping[str, Any]] | None = None,
        answer_hint: str = "Put the final answer in \\boxed{}.",
    ) -> None:
        known = _known_datasets()
        if not datasets:
            raise ConfigError("ReasoningGymTasks needs at least one dataset name")
        for name in datasets:
            if name not in known:
                raise ConfigError(
                    f"unknown reasoning-gym dataset {name!r}{did_you_mean(name, known)}"
                )
        self.datasets = tuple(datasets)
        self.config = {k: dict(v) for k, v in (config or {}).items()}
        self.answer_hint = answer_hint

    def sample(self, rng: np.random.Generator) -> Task:
        name = self.datasets[int(rng.integers(len(self.datasets)))]
        return self.make(name, int(rng.integers(0, 2**31 - 1)))

    def get(self, task_id: str) -> Task:
        parts = task_id.split("/")
        if len(parts) != 3 or parts[0] != "rg" or not parts[2].isdigit():
            raise ConfigError(f"task id {task_id!r} is not of the form rg/<dataset>/<seed>")
        if parts[1] not in self.datasets:
            raise ConfigError(f"task id {task_id!r}: dataset {parts[1]!r} is not enabled here")
        return self.make(parts[1], int(parts[2]))

    def make(self, name: str, seed: int) -> Task:
        """The task that reasoning-gym's ``name`` generates with ``seed``."""
        dataset = _reasoning_gym().create_dataset(
            name, seed=seed, size=1, **self.config.get(name, {})
        )
        entry = _plain(dataset[0])
        question = str(entry["question"]).rstrip()
        prompt = f"{question}\n\n{self.answer_hint}" if self.answer_hint else question
        return Task(
            id=f"rg/{name}/{seed}",
            prompt=prompt,
            answer=entry.get("answer"),
            metadata={"source": "reasoning_gym", "dataset": name, "entry": entry},
        )


def math_tasks_from_jsonl(
    path: str | Path, *, answer_hint: str = "Put the final answer in \\boxed{}."
) -> ListTaskSource:
    """Tasks from a JSONL file with ``question`` (or ``prompt``) and ``answer`` per line."""
    tasks = []
    for n, row in enumerate(read_jsonl(path, required=("answer",))):
        question = row.get("question", row.get("prompt"))
        if not isinstance(question, str):
            raise ConfigError(f"{path}: row {n} needs a 'question' string")
        task_id = str(row.get("id", row.get("task_id", f"{Path(path).stem}/{n}")))
        prompt = f"{question.rstrip()}\n\n{answer_hint}" if answer_hint else question
        extra = {
            k: v
            for k, v in row.items()
            if k not in ("id", "task_id", "question", "prompt", "answer")
        }
        tasks.append(
            Task(
                id=task_id,
                prompt=prompt,
                answer=row["answer"],
                metadata={"source": str(path), **extra},
            )
        )
    return ListTaskSource(tasks, name=str(path))
