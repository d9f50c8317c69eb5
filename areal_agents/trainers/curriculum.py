"""Which task a group trains on: the stream's next task, or the likeliest to teach
(``algo.task_sampling``).

GRPO learns only from a group whose rewards differ: a group of a task the policy always or
never solves has advantages of 0 everywhere and trains nothing. Dynamic sampling
(``algo.dynamic_sampling``) drops such groups after generating them. ``learnability`` sampling
chooses before generating, as prioritized level replay (Jiang et al., 2021) and learnability
sampling (Tzannetos et al., 2023; Foster and Foerster, 2025) do: each task family (generator
template, :func:`~areal_agents.trainers.data.task_family`; a task without one is its own
family) is rated by the chance that a group of it carries a signal, read from its last
:data:`WINDOW` finished groups with Laplace's rule, ``(groups with a spread + 1) / (groups +
2)`` (an unseen family: 1/2), and each new task is one of :data:`CANDIDATES` seeds drawn for
its index, chosen with probability in proportion to its family's rating. A family the policy
has mastered or cannot yet solve is drawn less often, never never: its rating stays above 0,
so a family the updates break is seen, and one that starts to be solved is found.

The choice is a pure function of the task's index, the stream's seed and the families' records,
which go into every checkpoint with the buffer (:meth:`LearnabilitySampler.state_dict`); the
chosen seed travels in the task's :class:`~areal_agents.trainers.data.TaskRef`, so a task run
again after a restart is the same task.

>>> from areal_agents.trainers.data import TaskRef
>>> sampler = LearnabilitySampler(lambda seed: "even" if seed % 2 == 0 else "odd", data_seed=0)
>>> for _ in range(WINDOW):  # every group of the "even" family was solved by all of its episodes
...     sampler.record(2, [1.0, 1.0])
>>> sampler.rating("even"), sampler.rating("odd")
(0.1, 0.5)
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from areal_agents.trainers.data import (
    TaskRef,
    avoid_tasks,
    task_family,
    task_id_of,
    task_seed,
)

__all__ = ["CANDIDATES", "WINDOW", "EnvFamilies", "LearnabilitySampler"]

CANDIDATES = 8
"""Seeds drawn for each new task, one of which is chosen."""
WINDOW = 8
"""Finished groups per family that rate it (the most recent ones: the policy moves)."""


@dataclasses.dataclass
class EnvFamilies:
    """The family of the task a rollout worker plays for seed ``seed``, without a reset (the
    environment's ``sample_task``: :func:`~areal_agents.trainers.data.task_id_of`); picklable,
    so that the buffer's process makes its own environment on first use.

    ``excluded``: the held-out task ids the workers keep out of training; a seed that draws one
    is played as the derived seed :func:`~areal_agents.trainers.data.avoid_tasks` gives, so its
    family is that task's, the one the group's rewards are about."""

    env_name: str
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    excluded: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self._env: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_env": None}  # the environment is made again where unpickled

    def close(self) -> None:
        """Close the environment made on first use (a later call makes another)."""
        if self._env is not None:
            self._env.close()
            self._env = None

    def __call__(self, seed: int) -> str:
        from areal_agents.envs.registry import make_env

        if self._env is None:
            self._env = make_env(self.env_name, **self.env_kwargs)
        task_id = task_id_of(self._env, avoid_tasks(self._env, seed, self.excluded))
        return task_family(task_id) or task_id


class LearnabilitySampler:
    """Chooses each new task's seed by its family's chance of a reward spread (module docstring).

    Args:
        family_of: the family of the task a seed draws (:class:`EnvFamilies`).
        data_seed: the task stream's seed (the choice's randomness derives from it).
    """

    def __init__(self, family_of: Callable[[int], str], *, data_seed: int = 0) -> None:
        self.family_of = family_of
        self.data_seed = int(data_seed)
        self.spreads: dict[str, deque[bool]] = {}
        self.chosen: dict[str, int] = {}  # family -> tasks chosen from it (a gauge)

    def rating(self, family: str) -> float:
        """The chance that a group of ``family`` has rewards that differ (Laplace's rule over
        its last :data:`WINDOW` groups)."""
        seen = self.spreads.get(family, ())
        return (sum(seen) + 1) / (len(seen) + 2)

    def choose(self, ref: TaskRef) -> TaskRef:
        """``ref`` with its seed replaced by the chosen candidate's (the first candidate is
        ``ref.seed``, the others derive from it)."""
        seeds = [ref.seed, *(task_seed(ref.seed, k) for k in range(1, CANDIDATES))]
        families = [self.family_of(s) for s in seeds]
        weights = np.array([self.rating(f) for f in families])
        rng = np.random.default_rng([self.data_seed, ref.index, 0x5A])
        pick = int(rng.choice(len(seeds), p=weights / weights.sum()))
        self.chosen[families[pick]] = self.chosen.get(families[pick], 0) + 1
        return TaskRef(ref.index, seeds[pick])

    def record(self, seed: int, rewards: Sequence[float]) -> None:
        """A finished group of the task ``seed`` draws, with its episodes' ``rewards``."""
        if not rewards:
            return
        family = self.family_of(seed)
        window = self.spreads.setdefault(family, deque(maxlen=WINDOW))
        window.append(len(set(rewards)) > 1)

    def stats(self) -> dict[str, float]:
        """Gauges: the families seen and the spread of their ratings."""
        ratings = [self.rating(f) for f in self.spreads] or [0.5]
        return {
            "tasks/families_seen": float(len(self.spreads)),
            "tasks/rating_min": min(ratings),
            "tasks/rating_max": max(ratings),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "spreads": {f: list(w) for f, w in self.spreads.items()},
            "chosen": dict(self.chosen),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.spreads = {
            str(f): deque((bool(x) for x in w), maxlen=WINDOW)
            for f, w in state.get("spreads", {}).items()
        }
        self.chosen = {str(f): int(n) for f, n in state.get("chosen", {}).items()}
