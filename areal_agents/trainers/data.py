"""A reproducible stream of tasks with a cursor, so a resumed run neither skips nor repeats one.

Task ``i`` of a run is identified by its index and a seed derived from ``(data_seed, i)``; an
environment given ``reset(seed=task.seed)`` draws the same task every time. Every sample of a
group resets with the same seed, so the group shares one task. The cursor (the next index) is
the whole state of the stream and goes into every checkpoint.

>>> stream = TaskStream(data_seed=7)
>>> first = [stream.next() for _ in range(3)]
>>> [t.index for t in first]
[0, 1, 2]
>>> again = TaskStream(data_seed=7)
>>> again.load_state_dict({"cursor": 2})
>>> again.next() == first[2]
True
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from areal_agents.errors import ConfigError

__all__ = ["TaskRef", "TaskStream", "avoid_tasks", "task_family", "task_id_of", "task_seed"]


def task_seed(data_seed: int, index: int) -> int:
    """The environment seed of task ``index`` (stable across runs, machines and versions)."""
    state = np.random.SeedSequence([int(data_seed), int(index)]).generate_state(1, np.uint32)
    return int(state[0])


@dataclass(frozen=True, order=True)
class TaskRef:
    """One task of the stream: its position in the run and the environment seed that draws it."""

    index: int
    seed: int


class TaskStream:
    """Tasks in a fixed order: index 0, 1, 2, ... with seeds from :func:`task_seed`."""

    def __init__(self, data_seed: int = 0) -> None:
        self.data_seed = int(data_seed)
        self.cursor = 0

    def next(self) -> TaskRef:
        """The next task; advances the cursor."""
        ref = TaskRef(self.cursor, task_seed(self.data_seed, self.cursor))
        self.cursor += 1
        return ref

    def ref(self, index: int) -> TaskRef:
        """The task at ``index`` (without moving the cursor)."""
        return TaskRef(index, task_seed(self.data_seed, index))

    def state_dict(self) -> dict[str, Any]:
        return {"data_seed": self.data_seed, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data_seed = int(state.get("data_seed", self.data_seed))
        self.cursor = int(state["cursor"])


def task_id_of(env: Any, seed: int) -> str:
    """The id of the task ``env.reset(seed=seed)`` draws, without resetting (no sandbox is
    acquired): the environment's ``sample_task`` with the generator ``reset`` would seed.

    Raises :class:`ConfigError` for an environment that has no ``sample_task`` (its tasks
    cannot be told apart before a reset, so none can be held out)."""
    from gymnasium.utils import seeding

    sample = getattr(env.unwrapped, "sample_task", None)
    if sample is None:
        raise ConfigError(
            f"{type(env.unwrapped).__name__} has no sample_task, so no task can be held out "
            "of training: set eval.held_out_tasks=0"
        )
    return str(sample(seeding.np_random(int(seed))[0]).id)


def avoid_tasks(env: Any, seed: int, excluded: Collection[str], tries: int = 1000) -> int:
    """``seed``, or the first of a fixed sequence of seeds derived from it whose task is not in
    ``excluded`` (task ids): every sample of a group, and a resumed run, make the same choice.

    >>> from areal_agents.envs.registry import make_env
    >>> env = make_env("calculator")
    >>> held = {task_id_of(env, 5)}
    >>> avoid_tasks(env, 7, held) == 7, avoid_tasks(env, 5, held) != 5
    (True, True)
    >>> task_id_of(env, avoid_tasks(env, 5, held)) in held
    False
    """
    if not excluded:
        return seed
    for attempt in range(tries):
        candidate = seed if attempt == 0 else task_seed(seed, attempt)
        if task_id_of(env, candidate) not in excluded:
            return candidate
    raise ConfigError(
        f"{tries} seeds in a row drew held-out tasks: the environment has too few distinct "
        "tasks for eval.held_out_tasks; lower it (or 0)"
    )


#: The number that ends a source's name where it names one instance of a generator (``kb7``).
_INSTANCE_NUMBER = re.compile(r"(?<=[A-Za-z])\d+$")


def task_family(task_id: str) -> str | None:
    """The family (generator template) of a task, read from its id: the procedural sources
    name their tasks ``<source>/<template>/<instance>`` (``gen/count_words/17``,
    ``rg/basic_arithmetic/3``), whose family is ``<source>/<template>``. A source named with a
    number at its end is one instance of a generator, not a template: ``search`` builds a
    knowledge base per task (``kb1016164991/birth_currency/person-36``), and its questions'
    family is the relation they ask for, whatever the base (``kb/birth_currency``). None for an
    id of fewer parts (``HumanEval/12``, a JSONL file's ``name/7``): such a task is a family
    of its own.

    >>> task_family("gen/count_words/1099128568"), task_family("HumanEval/12")
    ('gen/count_words', None)
    >>> task_family("kb1016164991/city_capital/city-13")
    'kb/city_capital'"""
    parts = task_id.split("/")
    if len(parts) < 3 or not all(parts):
        return None
    source = _INSTANCE_NUMBER.sub("", parts[0])  # a letter stays before the number
    return "/".join([source, *parts[1:-1]])
