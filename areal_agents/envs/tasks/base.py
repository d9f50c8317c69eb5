"""Task sources: where an environment's problems come from.

A :class:`TaskSource` draws a task with the environment's seeded generator (``sample``) and
finds one by id (``get``), so that ``reset(seed=...)`` is reproducible and
``reset(options={"task_id": ...})`` selects a task. Finite sources (a benchmark, a JSONL file)
are :class:`ListTaskSource`; generators (reasoning-gym, the procedural code tasks, the
synthetic knowledge base) encode their seed in the task id, so any id they hand out can be
regenerated.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

import numpy as np

from areal_agents.envs.base import Task
from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.files import read_jsonl  # re-exported: the task loaders' reader

__all__ = ["ListTaskSource", "TaskSource", "read_jsonl"]


@runtime_checkable
class TaskSource(Protocol):
    """Anything that can draw a task from a seeded generator and look one up by id."""

    def sample(self, rng: np.random.Generator) -> Task:
        """A task drawn with ``rng`` (and nothing else, so that seeding is reproducible)."""
        ...

    def get(self, task_id: str) -> Task:
        """The task with this id; :class:`~areal_agents.errors.ConfigError` if there is none."""
        ...


class ListTaskSource:
    """A finite list of tasks, sampled uniformly.

    >>> source = ListTaskSource([Task("a", "1+1?", 2), Task("b", "2+2?", 4)], name="toy")
    >>> source.get("b").answer, len(source)
    (4, 2)
    >>> source.sample(np.random.default_rng(0)).id in {"a", "b"}
    True
    """

    def __init__(self, tasks: Iterable[Task], *, name: str = "tasks") -> None:
        self.tasks: list[Task] = list(tasks)
        self.name = name
        if not self.tasks:
            raise ConfigError(f"task source {name!r} holds no tasks")
        self._by_id = {t.id: t for t in self.tasks}
        if len(self._by_id) != len(self.tasks):
            raise ConfigError(f"task source {name!r} has duplicate task ids")

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    @property
    def ids(self) -> list[str]:
        return [t.id for t in self.tasks]

    def sample(self, rng: np.random.Generator) -> Task:
        return self.tasks[int(rng.integers(len(self.tasks)))]

    def get(self, task_id: str) -> Task:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise ConfigError(
                f"no task {task_id!r} in {self.name}" + did_you_mean(task_id, self._by_id)
            ) from None
