"""The trajectory buffer: admission under a staleness bound; batches of complete groups.

Rollout workers ask :meth:`TrajectoryBuffer.admit` for tasks and hand back whole groups with
:meth:`TrajectoryBuffer.complete`; the learner takes :meth:`TrajectoryBuffer.pop_batch`.

**Staleness bound** (as in AReaL). With ``G`` groups per training step, weights of version ``v``
on the inference servers and bound ``max_staleness`` (``η``), a new task is admitted only while
``trained + in_flight + ready < (v + η + 1) * G``. Step ``s`` (0-based: it trains weights of
version ``s`` and pushes version ``s + 1``) is the one with ``trained = s * G``, so a group
admitted under version ``v`` has a *deadline*: it must be trained at step ``v + η`` at the
latest, and then no token is more than ``η`` versions older than the weights it trains.
``η = 0`` is synchronous training (nothing is admitted while the learner works). Dropped and
filtered groups release their slot.

**Order** (``batch_order``):

- ``"admission"``: a batch is always the ``G`` oldest admitted groups that are still usable,
  taken only once every one of them is complete. Batches then do not depend on which episode
  finished first, so a resumed run trains exactly the same groups as an uninterrupted one.
- ``"ready"`` (the default): a batch is the ``G`` oldest *complete* groups, so one long episode
  does not hold back groups that finished after it — provided every group left waiting can
  still meet its deadline. The check: sort the deadlines of all groups left pending (in
  flight, complete but not taken, and tasks to redo after a resume, whose deadline is the
  current version + ``η``) as ``d_0 <= d_1 <= ...``; later batches filled earliest deadline
  first train group ``i`` at step ``s + 1 + i // G``, which must be ``<= d_i`` for every ``i``.
  When that fails, the batch is the ``G`` groups with the earliest deadlines (without a resume,
  the ``G`` oldest: the admission-order rule), taken once all are complete. New admissions
  always fit (their deadline is the latest and the admission bound leaves a slot for them), so
  the bound stays strict; with ``η = 0`` both orders are the same.

**Cost.** Admitted groups are kept indexed by deadline (a deadline never changes between
admission and training), so :meth:`TrajectoryBuffer.pop_batch` decides from per-deadline counts
and list ends: a call that finds no batch costs O(distinct deadlines), about ``η + 2``, however
many episodes are in flight, and taking a batch costs O(G) (``benchmarks/buffer_scale.py``).

**Faults.** A task is admitted to a *holder* (a rollout worker, under the name it uses now):
:meth:`TrajectoryBuffer.requeue` takes back the tasks of a worker that died (or of every
worker, when a server died under their episodes) and admits them again, first, before any new
task; a group a superseded holder hands back late is ignored, so no task is trained twice.

The class is plain Python (tests use it directly); the trainer wraps it as a Ray actor.

>>> buf = TrajectoryBuffer(groups_per_step=2, max_staleness=0)
>>> [ref.index for ref, _ in buf.admit(8)]
[0, 1]
>>> buf.admit(1)  # full until the learner consumes a batch and version 1 is pushed
[]
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from areal_agents.errors import ConfigError
from areal_agents.trainers.curriculum import LearnabilitySampler
from areal_agents.trainers.data import TaskRef, TaskStream
from areal_agents.trainers.groups import Group, trajectory_from_dict, trajectory_to_dict
from areal_agents.types import Trajectory

__all__ = [
    "BatchOrder",
    "Group",
    "TrajectoryBuffer",
    "trajectory_from_dict",
    "trajectory_to_dict",
]

BatchOrder = Literal["ready", "admission"]
"""How :meth:`TrajectoryBuffer.pop_batch` chooses a batch (see the module docstring)."""


class TrajectoryBuffer:
    """Staleness-bounded store of completed groups.

    Args:
        groups_per_step: tasks (groups) in one training batch.
        max_staleness: how many versions behind the trained weights a token may be.
        data_seed: seed of the task stream.
        dynamic_sampling: drop groups whose rewards are all equal (no learning signal); their
            slot goes to a new task (``algo.dynamic_sampling``).
        batch_order: ``"ready"`` (complete groups first, within every group's deadline) or
            ``"admission"`` (strict admission order: reproducible batches).
        total_groups: the groups the run will train (``total_steps * groups_per_step``); no
            task is admitted past it, so nothing is generated that would never be trained and a
            run ends with every admitted group trained (a dropped or filtered group releases
            its slot). Sync and async then train the same tasks. None: no limit.
        task_families: the family of the task a seed draws; given, each new task is chosen
            among candidates by its family's chance of a reward spread
            (``algo.task_sampling=learnability``: :mod:`~areal_agents.trainers.curriculum`).
    """

    def __init__(
        self,
        groups_per_step: int,
        max_staleness: int,
        *,
        data_seed: int = 0,
        dynamic_sampling: bool = False,
        batch_order: BatchOrder = "ready",
        total_groups: int | None = None,
        task_families: Callable[[int], str] | None = None,
    ) -> None:
        if groups_per_step < 1:
            raise ConfigError(f"groups_per_step={groups_per_step}: must be at least 1")
        if max_staleness < 0:
            raise ConfigError(f"max_staleness={max_staleness}: must be 0 or more")
        if batch_order not in ("ready", "admission"):
            raise ConfigError(f"batch_order={batch_order!r}: choose 'ready' or 'admission'")
        if total_groups is not None and total_groups < 1:
            raise ConfigError(f"total_groups={total_groups}: must be at least 1 or None")
        self.batch_order = batch_order
        self.total_groups = total_groups
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.dynamic_sampling = dynamic_sampling
        self.stream = TaskStream(data_seed)
        self.sampler = (
            LearnabilitySampler(task_families, data_seed=data_seed) if task_families else None
        )
        self.version = 0
        self.trained_groups = 0
        self.closed = False
        self._redo: list[TaskRef] = []  # in flight at the last checkpoint: run these first
        self._inflight: dict[int, tuple[TaskRef, int]] = {}
        self._holder: dict[int, str] = {}  # in-flight index -> who runs it (when named)
        self._ready: dict[int, Group] = {}
        # Indexes over the admitted groups (in flight or ready; not the tasks to redo), so that
        # a pop costs O(G + distinct deadlines), not O(pending): every admitted index in order;
        # by deadline (admitted version + eta, fixed from admission to the pop), all of them
        # and the ready ones, each list sorted.
        self._order: list[int] = []
        self._by_deadline: dict[int, list[int]] = {}
        self._ready_by_deadline: dict[int, list[int]] = {}
        self._ready_order: list[int] = []
        self.counters: dict[str, int] = {
            "finished_episodes": 0,  # handed back with a trajectory (trained or filtered)
            "dropped_episodes": 0,  # dropped for infrastructure faults after their retries
            "dropped_groups": 0,
            "filtered_groups": 0,
            "admitted_groups": 0,
            "reordered_batches": 0,  # batches that passed over an older, unfinished group
            "requeued_groups": 0,  # taken back from a dead worker or server, admitted again
        }

    # ---- admission -------------------------------------------------------------------------

    def capacity(self) -> int:
        """How many more tasks may start now without breaking the staleness bound."""
        limit = (self.version + self.max_staleness + 1) * self.groups_per_step
        if self.total_groups is not None:
            limit = min(limit, self.total_groups)
        used = self.trained_groups + len(self._inflight) + len(self._ready)
        return max(0, limit - used)

    def admit(self, max_tasks: int = 1, holder: str | None = None) -> list[tuple[TaskRef, int]]:
        """Up to ``max_tasks`` tasks to start now, each with the server version it starts under
        (``holder``: who runs them, for :meth:`requeue` and :meth:`complete`)."""
        if self.closed:
            return []
        out: list[tuple[TaskRef, int]] = []
        for _ in range(min(max_tasks, self.capacity())):
            ref = self._redo.pop(0) if self._redo else self._new_task()
            self._inflight[ref.index] = (ref, self.version)
            if holder is not None:
                self._holder[ref.index] = holder
            self._index(ref.index, self.version + self.max_staleness)
            self.counters["admitted_groups"] += 1
            out.append((ref, self.version))
        return out

    def _new_task(self) -> TaskRef:
        """The stream's next task, or the one the sampler chooses for its index."""
        ref = self.stream.next()
        return self.sampler.choose(ref) if self.sampler else ref

    def complete(
        self,
        index: int,
        trajectories: Sequence[Trajectory],
        *,
        dropped_episodes: int = 0,
        transcripts: Sequence[dict[str, Any]] = (),
        stats: Mapping[str, float] | None = None,
        holder: str | None = None,
    ) -> str:
        """Hand back the finished group of task ``index``; returns "ready", "dropped" or
        "filtered". An unknown index (a task from before a restart, or taken back by
        :meth:`requeue`) and a group from a holder the task no longer has are "ignored"."""
        if holder is not None and self._holder.get(index, holder) != holder:
            return "ignored"
        entry = self._inflight.pop(index, None)
        if entry is None:
            return "ignored"
        self._holder.pop(index, None)
        ref, version = entry
        deadline = version + self.max_staleness
        self.counters["dropped_episodes"] += dropped_episodes
        self.counters["finished_episodes"] += len(trajectories)
        rewards = [t.reward for t in trajectories]
        if self.sampler is not None:
            self.sampler.record(ref.seed, rewards)
        if not trajectories:
            self.counters["dropped_groups"] += 1
            self._unindex(index, deadline)
            return "dropped"
        if self.dynamic_sampling and len(set(rewards)) == 1:
            self.counters["filtered_groups"] += 1
            self._unindex(index, deadline)
            return "filtered"
        bisect.insort(self._ready_by_deadline.setdefault(deadline, []), index)
        bisect.insort(self._ready_order, index)
        self._ready[index] = Group(
            task=ref,
            admitted_version=version,
            trajectories=list(trajectories),
            dropped_episodes=dropped_episodes,
            transcripts=list(transcripts),
            stats=dict(stats or {}),
        )
        return "ready"

    def requeue(self, holder_prefix: str | None = None) -> list[int]:
        """Take back the tasks in flight (those whose holder starts with ``holder_prefix``;
        None: all) and admit them again before any new task; returns their indices.

        For a rollout worker that died, or every worker when a server died under their
        episodes: what they generated is lost, the tasks are not (and were never trained).
        """
        taken = [
            i
            for i in sorted(self._inflight)
            if holder_prefix is None or self._holder.get(i, "").startswith(holder_prefix)
        ]
        for i in taken:
            ref, version = self._inflight.pop(i)
            self._holder.pop(i, None)
            self._unindex(i, version + self.max_staleness)
            bisect.insort(self._redo, ref)
        self.counters["requeued_groups"] += len(taken)
        return taken

    # ---- consumption -----------------------------------------------------------------------

    def pending(self) -> list[int]:
        """Indices admitted and not yet trained, dropped or filtered (oldest first)."""
        redo = [r.index for r in self._redo]
        return sorted([*self._inflight, *self._ready, *redo])

    def pop_batch(self) -> list[Group] | None:
        """The next batch of ``G`` complete groups, or None while it is not there yet.

        ``admission`` order: the oldest ``G`` pending groups once all are complete. ``ready``
        order: the oldest ``G`` complete groups when every group left waiting can still be
        trained by its deadline, else the ``G`` most urgent once complete (module docstring).
        """
        g = self.groups_per_step
        if len(self._ready) < g:  # a batch is G complete groups: not there yet
            return None
        # Each branch decides from per-deadline counts and list ends (O(distinct deadlines))
        # and builds the G indices only when it takes them.
        if self.batch_order == "admission":
            if not self._oldest_all_ready(g):
                return None
            head = self._oldest(g)
        elif self._feasible_after(self._ready_take(g)):
            head = self._ready_urgent(g)
        elif self._urgent_all_ready(g):
            head = self._urgent(g)
        else:
            return None
        if head != self._oldest(g):
            self.counters["reordered_batches"] += 1
        self.trained_groups += g
        out = [self._ready.pop(i) for i in head]
        for group in out:
            deadline = group.admitted_version + self.max_staleness
            self._unindex(group.task.index, deadline)
            _remove(self._ready_by_deadline, deadline, group.task.index)
            del self._ready_order[bisect.bisect_left(self._ready_order, group.task.index)]
        return out

    # ---- the indexes behind pop_batch ------------------------------------------------------

    def _index(self, index: int, deadline: int) -> None:
        bisect.insort(self._order, index)
        bisect.insort(self._by_deadline.setdefault(deadline, []), index)

    def _unindex(self, index: int, deadline: int) -> None:
        del self._order[bisect.bisect_left(self._order, index)]
        _remove(self._by_deadline, deadline, index)

    def _redo_indices(self) -> list[int]:
        return sorted(r.index for r in self._redo)

    def _oldest(self, n: int) -> list[int]:
        """``pending()[:n]`` without building the whole list."""
        if not self._redo:
            return self._order[:n]
        return list(itertools.islice(heapq.merge(self._order, self._redo_indices()), n))

    def _urgent_iter(self) -> Iterator[int]:
        """Pending indices by (deadline, index): the tasks to redo count as admitted now."""
        redo_deadline = self.version + self.max_staleness
        keys = set(self._by_deadline)
        if self._redo:
            keys.add(redo_deadline)
        for d in sorted(keys):
            block = self._by_deadline.get(d, [])
            if self._redo and d == redo_deadline:
                yield from heapq.merge(block, self._redo_indices())
            else:
                yield from block

    def _urgent(self, n: int) -> list[int]:
        return list(itertools.islice(self._urgent_iter(), n))

    def _ready_urgent(self, n: int) -> list[int]:
        """The ``n`` complete groups with the earliest (deadline, index)."""
        out: list[int] = []
        for d in sorted(self._ready_by_deadline):
            out.extend(self._ready_by_deadline[d][: n - len(out)])
            if len(out) >= n:
                break
        return out

    def _ready_take(self, n: int) -> dict[int, int]:
        """How many of :meth:`_ready_urgent` ``(n)`` each deadline holds (without the list)."""
        take: dict[int, int] = {}
        left = n
        for d in sorted(self._ready_by_deadline):
            if left == 0:
                break
            take[d] = min(left, len(self._ready_by_deadline[d]))
            left -= take[d]
        return take

    def _feasible_after(self, taken: Mapping[int, int]) -> bool:
        """Whether, with ``taken[d]`` groups of deadline ``d`` taken now, every group left
        pending meets its deadline when later batches are filled earliest deadline first: the
        ``k``-th of them (0-based, by deadline) is trained at step ``s + 1 + k // G``. Within a
        block of equal deadlines the last group is trained latest, so only it is checked."""
        g = self.groups_per_step
        first = self.trained_groups // g + 1
        counts = {d: len(block) for d, block in self._by_deadline.items()}
        if self._redo:
            d = self.version + self.max_staleness
            counts[d] = counts.get(d, 0) + len(self._redo)
        for d, n in taken.items():
            counts[d] -= n
        k = 0
        for d in sorted(counts):
            k += counts[d]
            if counts[d] and first + (k - 1) // g > d:
                return False
        return True

    def _redo_first(self) -> int | None:
        """The smallest index to redo (``_redo`` is kept sorted: ``state_dict`` sorts it)."""
        return self._redo[0].index if self._redo else None

    def _oldest_all_ready(self, n: int) -> bool:
        """Whether ``pending()[:n]`` are all complete: the ``n``-th oldest admitted group is
        the ``n``-th oldest complete one, and no task to redo is older."""
        if len(self._order) < n or len(self._ready_order) < n:
            return False
        redo = self._redo_first()
        if redo is not None and redo < self._order[n - 1]:
            return False
        return self._ready_order[n - 1] == self._order[n - 1]

    def _urgent_all_ready(self, n: int) -> bool:
        """Whether the ``n`` most urgent pending groups are all complete (per deadline block:
        its first ``m`` are complete iff the ``m``-th complete one is its ``m``-th)."""
        redo_deadline = self.version + self.max_staleness
        redo = self._redo_first()
        keys = set(self._by_deadline)
        if redo is not None:
            keys.add(redo_deadline)
        left = n
        for d in sorted(keys):
            block = self._by_deadline.get(d, [])
            here = len(self._redo) if redo is not None and d == redo_deadline else 0
            m = min(left, len(block) + here)
            if m == 0:
                continue
            if here and (m > len(block) or block[m - 1] > redo):  # type: ignore[operator]
                return False
            ready = self._ready_by_deadline.get(d, [])
            if len(ready) < m or ready[m - 1] != block[m - 1]:
                return False
            left -= m
            if left == 0:
                return True
        return left == 0

    def deadlines(self) -> dict[int, int]:
        """The last step allowed to train each pending group (its admitted version + ``η``).

        Tasks to redo after a resume count as admitted now (they start under this version or
        a later one). Step ``s`` is the one with ``trained_groups == s * G``.
        """
        eta = self.max_staleness
        out = {i: version + eta for i, (_, version) in self._inflight.items()}
        out.update({i: group.admitted_version + eta for i, group in self._ready.items()})
        out.update({ref.index: self.version + eta for ref in self._redo})
        return out

    def set_version(self, version: int) -> None:
        """Record the weight version now served by every inference server."""
        self.version = int(version)

    def close(self) -> None:
        """Admit nothing more (the run is ending)."""
        self.closed = True

    def is_closed(self) -> bool:
        return self.closed

    def stats(self) -> dict[str, float]:
        """Gauges for the progress bar and the metrics file."""
        ready = list(self._ready.values())
        return {
            "buffer/in_flight": float(len(self._inflight)),
            "buffer/ready": float(len(ready)),
            "buffer/capacity": float(self.capacity()),
            "buffer/cursor": float(self.stream.cursor),
            "buffer/ready_age_mean": (
                statistics.fmean(self.version - g.admitted_version for g in ready) if ready else 0.0
            ),
            **{f"buffer/{k}": float(v) for k, v in self.counters.items()},
            **(self.sampler.stats() if self.sampler else {}),
        }

    # ---- checkpointing ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: cursor, in-flight tasks and ready groups.

        In-flight tasks are saved as "to redo": their partial episodes die with the process,
        so a resumed run starts them again (they were never trained, so this repeats nothing).
        """
        redo = sorted([*self._redo, *(ref for ref, _ in self._inflight.values())])
        return {
            "stream": self.stream.state_dict(),
            "version": self.version,
            "trained_groups": self.trained_groups,
            "redo": [{"index": r.index, "seed": r.seed} for r in redo],
            "ready": [self._ready[i].to_dict() for i in sorted(self._ready)],
            "counters": dict(self.counters),
            **({"sampler": self.sampler.state_dict()} if self.sampler else {}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.stream.load_state_dict(dict(state["stream"]))
        self.version = int(state["version"])
        self.trained_groups = int(state["trained_groups"])
        self._redo = [TaskRef(int(r["index"]), int(r["seed"])) for r in state["redo"]]
        self._inflight, self._holder = {}, {}
        self._ready = {int(g["task"]["index"]): Group.from_dict(g) for g in state["ready"]}
        self._order, self._by_deadline, self._ready_by_deadline = [], {}, {}
        self._ready_order = sorted(self._ready)
        for i, group in sorted(self._ready.items()):
            deadline = group.admitted_version + self.max_staleness
            self._index(i, deadline)
            self._ready_by_deadline.setdefault(deadline, []).append(i)
        self.counters.update({k: int(v) for k, v in state.get("counters", {}).items()})
        if self.sampler is not None:
            self.sampler.load_state_dict(state.get("sampler", {}))


def _remove(lists: dict[int, list[int]], key: int, index: int) -> None:
    """Take ``index`` out of the sorted list ``lists[key]``; drop the list once empty."""
    block = lists[key]
    del block[bisect.bisect_left(block, index)]
    if not block:
        del lists[key]
