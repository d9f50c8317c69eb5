"""The discrete-event simulation: the real buffer, simulated servers, learner and clock.

Nothing here decides admission, staleness or batch order: every decision is the trainer's own
:class:`~areal_agents.trainers.buffer.TrajectoryBuffer` (``admit``, ``complete``,
``pop_batch``, ``set_version``), called as the training loop and the rollout workers call it.
What is simulated is time:

- **Servers** share their throughput among their requests (processor sharing): with ``c``
  requests in flight each advances at ``tokens_per_s(c) / c``. A turn is one request of the
  turn's policy tokens; an episode stays on one server (round-robin, as the rollout workers
  assign policies) and waits ``env_step_s`` between turns.
- **Rollout workers** keep at most ``concurrent_groups`` groups in flight and ask the buffer
  for more whenever one finishes or a version is pushed.
- **The learner** takes a batch whenever the buffer gives one, trains for
  ``learner.train_s(tokens)``, then pushes the weights: it holds the learner for
  ``push_learner_s`` (the snapshot) and the servers for ``push_s`` (they pause when the profile
  says so), and the buffer's version is set once the servers have them. With ``overlap_push``
  (the trainer's ``trainer.overlap_weight_push``) the learner trains the next batch meanwhile
  and only the next push waits for this one; without, the step ends when the push does.

Each server keeps a *virtual clock* (tokens served to each of its requests so far); a request
ends when that clock reaches its start plus its tokens, so one event costs ``O(log n)`` however
many requests are in flight.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, cast

from areal_agents.errors import ConfigError
from areal_agents.simulation.profile import Profile
from areal_agents.trainers.buffer import BatchOrder, TrajectoryBuffer
from areal_agents.trainers.data import TaskRef
from areal_agents.types import Trajectory

__all__ = ["EpisodeShape", "ShapeFn", "SimConfig", "SimResult", "simulate"]


@dataclass(frozen=True)
class EpisodeShape:
    """One episode's length: its turns and the policy tokens of each."""

    tokens: tuple[int, ...]

    @property
    def turns(self) -> int:
        return len(self.tokens)


ShapeFn = Callable[[TaskRef, int], EpisodeShape]
"""``(task, sample) -> EpisodeShape``: replaces the profile's length distribution (to replay
the very tasks a measured run drew)."""


@dataclass(frozen=True)
class SimConfig:
    """The run to simulate (the trainer's own keys where they exist)."""

    mode: Literal["sync", "async"] = "async"
    """``sync`` is ``max_staleness=0`` (the trainer's ``trainer.mode=sync``)."""
    max_staleness: int = 2
    """The staleness bound in async mode (``trainer.max_staleness``)."""
    servers: int = 1
    learners: int = 1
    groups_per_step: int = 2
    group_size: int = 4
    steps: int = 8
    concurrent_groups: int | None = None
    """Groups in flight at once over all rollout workers (None: as many as the buffer admits)."""
    batch_order: BatchOrder = "ready"
    overlap_push: bool = True
    """The next step trains while the servers load the last push
    (``trainer.overlap_weight_push``)."""
    seed: int = 0
    """Seed of the task stream (``trainer.seed``) and of the length draws."""

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise ConfigError(f"mode={self.mode!r}: choose 'sync' or 'async'")
        for name in ("servers", "learners", "groups_per_step", "group_size", "steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be at least 1")
        if self.concurrent_groups is not None and self.concurrent_groups < 1:
            raise ConfigError(f"concurrent_groups={self.concurrent_groups}: at least 1 or None")

    @property
    def staleness(self) -> int:
        return 0 if self.mode == "sync" else self.max_staleness


@dataclass
class SimResult:
    """What one simulated run measured (the same figures as ``benchmarks/async_vs_sync.py``)."""

    elapsed_s: float
    steps: int
    trained_samples: int
    trained_tokens: int
    turns_mean: float
    staleness_mean: float
    staleness_max: int
    generation_idle_frac: float
    """Time-average share of servers with no request in flight (a push counts as busy)."""
    learner_idle_frac: float
    """Share of the time the learner did not train."""
    train_s: float
    push_s: float
    generated_tokens: int
    step_ends: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.trained_tokens / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.trained_samples / self.elapsed_s if self.elapsed_s else 0.0

    def to_dict(self) -> dict[str, float | int]:
        return {
            "elapsed_s": round(self.elapsed_s, 3),
            "steps": self.steps,
            "trained_samples": self.trained_samples,
            "trained_tokens": self.trained_tokens,
            "tokens_per_s": round(self.tokens_per_s, 4),
            "samples_per_s": round(self.samples_per_s, 5),
            "turns_mean": round(self.turns_mean, 3),
            "staleness_mean": round(self.staleness_mean, 3),
            "staleness_max": self.staleness_max,
            "generation_idle_frac": round(self.generation_idle_frac, 4),
            "learner_idle_frac": round(self.learner_idle_frac, 4),
            "train_s": round(self.train_s, 3),
            "push_s": round(self.push_s, 3),
            "generated_tokens": self.generated_tokens,
        }


class _Episode:
    __slots__ = ("first_version", "group", "server", "tokens", "turn")

    def __init__(self, group: int, server: int, tokens: tuple[int, ...]) -> None:
        self.group = group
        self.server = server
        self.tokens = tokens
        self.turn = 0
        self.first_version = -1


class _Server:
    """Processor sharing on a virtual clock: ``vclock`` grows by each request's share."""

    __slots__ = ("busy_s", "epoch", "heap", "last_t", "paused", "rate", "vclock")

    def __init__(self) -> None:
        self.vclock = 0.0
        self.last_t = 0.0
        self.rate = 0.0  # tokens per second per request
        self.heap: list[tuple[float, int, _Episode]] = []
        self.epoch = 0
        self.paused = False
        self.busy_s = 0.0

    def advance(self, now: float) -> None:
        dt = now - self.last_t
        if self.heap or self.paused:
            self.busy_s += dt
        if not self.paused:
            self.vclock += self.rate * dt
        self.last_t = now


# event kinds
_SERVER, _TURN, _TRAINED, _PUSHED, _STEP_END = 0, 1, 2, 3, 4


class _Sim:
    def __init__(self, profile: Profile, cfg: SimConfig, shape: ShapeFn | None) -> None:
        self.p, self.cfg = profile, cfg
        self.shape = shape or self._draw_shape
        self.buffer = TrajectoryBuffer(
            cfg.groups_per_step, cfg.staleness, data_seed=cfg.seed, batch_order=cfg.batch_order
        )
        self.servers = [_Server() for _ in range(cfg.servers)]
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.now = 0.0
        self.next_server = 0
        self.groups: dict[int, list[_Episode]] = {}
        self.left: dict[int, int] = {}  # episodes of a group still running
        self.in_flight = 0
        self.limit = cfg.concurrent_groups or 1 << 60
        self.version = 0  # the servers' weights
        self.learner_busy = False  # training, taking the snapshot, or waiting on a push
        self.training = False
        self.pushing = False  # the servers' half of a push is under way
        self.push_waiting = False  # a trained step waits for the push before it to finish
        self.batch_may_be_ready = False  # a group completed or the learner became free
        self.step = 0
        self.step_ends: list[float] = []
        self.train_s = 0.0
        self.push_total = 0.0
        self.trained: list[tuple[int, int, int]] = []  # (tokens, turns, staleness) per sample
        self.generated = 0
        self.turn_choices = (list(profile.episode.turns), list(profile.episode.turns.values()))
        tpt = profile.episode.tokens_per_turn
        self.token_choices = (list(tpt), list(tpt.values()))

    # ---- the clock -----------------------------------------------------------------------

    def schedule(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def run(self) -> SimResult:
        self.admit()
        while len(self.step_ends) < self.cfg.steps:
            if not self.events:
                raise RuntimeError("the simulation stalled: no event and the run is not done")
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            if kind == _SERVER:
                sid, epoch = cast(tuple[int, int], payload)
                if epoch == self.servers[sid].epoch:
                    self.server_event(sid)
            elif kind == _TURN:
                self.start_turn(cast(_Episode, payload))
            elif kind == _TRAINED:
                self.trained_done()
            elif kind == _PUSHED:
                self.pushed(cast(int, payload))
            else:
                self.step_end()
            if self.batch_may_be_ready:
                self.try_train()
        return self.result()

    # ---- generation ----------------------------------------------------------------------

    def _draw_shape(self, ref: TaskRef, sample: int) -> EpisodeShape:
        ep = self.p.episode
        rng = random.Random(ref.seed * 1_000_003 + (0 if ep.turns_shared_by_group else sample))
        turns = rng.choices(*self.turn_choices)[0]
        rng_tok = random.Random(ref.seed * 7_919 + sample)
        return EpisodeShape(
            tuple(round(rng_tok.choices(*self.token_choices)[0]) for _ in range(turns))
        )

    def admit(self) -> None:
        free = self.limit - self.in_flight
        if free <= 0:
            return
        for ref, _version in self.buffer.admit(free):
            self.in_flight += 1
            episodes = []
            for sample in range(self.cfg.group_size):
                ep = _Episode(ref.index, self.next_server, self.shape(ref, sample).tokens)
                self.next_server = (self.next_server + 1) % len(self.servers)
                episodes.append(ep)
            self.groups[ref.index] = episodes
            self.left[ref.index] = len(episodes)
            for ep in episodes:
                self.start_turn(ep)

    def start_turn(self, ep: _Episode) -> None:
        server = self.servers[ep.server]
        if ep.turn == 0:
            ep.first_version = self.version
        server.advance(self.now)
        heapq.heappush(server.heap, (server.vclock + ep.tokens[ep.turn], id(ep), ep))
        self.reschedule(ep.server)

    def reschedule(self, sid: int) -> None:
        """New rate after a change of load; the server's next completion as an event."""
        server = self.servers[sid]
        server.epoch += 1
        n = len(server.heap)
        prof = self.p.server
        factor = prof.efficiency * (prof.while_training if self.training else 1.0)
        server.rate = prof.tokens_per_s(n) * factor / n if n else 0.0
        if n and not server.paused:
            left = max(0.0, server.heap[0][0] - server.vclock)
            self.schedule(self.now + left / server.rate, _SERVER, (sid, server.epoch))

    def server_event(self, sid: int) -> None:
        server = self.servers[sid]
        server.advance(self.now)
        done = []
        while server.heap and server.heap[0][0] <= server.vclock + 1e-9:
            done.append(heapq.heappop(server.heap)[2])
        self.reschedule(sid)
        for ep in done:
            self.generated += ep.tokens[ep.turn]
            ep.turn += 1
            if ep.turn < len(ep.tokens):
                if self.p.episode.env_step_s > 0:
                    self.schedule(self.now + self.p.episode.env_step_s, _TURN, ep)
                else:
                    self.start_turn(ep)
            else:
                self.episode_done(ep)

    def episode_done(self, ep: _Episode) -> None:
        self.left[ep.group] -= 1
        if self.left[ep.group]:
            return
        del self.left[ep.group]
        trajectories = [
            Trajectory((), (), (), (), reward=float(i % 2), group_id=f"task{ep.group}")
            for i in range(self.cfg.group_size)
        ]
        self.buffer.complete(ep.group, trajectories)
        self.batch_may_be_ready = True
        self.in_flight -= 1
        self.admit()

    # ---- learning ------------------------------------------------------------------------

    def try_train(self) -> None:
        if self.learner_busy or self.step >= self.cfg.steps:  # (step: trained so far)
            return
        self.batch_may_be_ready = False
        batch = self.buffer.pop_batch()
        if batch is None:
            return
        tokens = 0
        for group in batch:
            for ep in self.groups.pop(group.task.index):
                n = sum(ep.tokens)
                tokens += n
                self.trained.append((n, len(ep.tokens), self.step - ep.first_version))
        self.learner_busy = True
        self.set_training(True)
        dt = self.p.learner.train_s(tokens, self.cfg.learners)
        self.train_s += dt
        self.schedule(self.now + dt, _TRAINED, None)

    def set_training(self, training: bool) -> None:
        """The learner starts or stops training: the servers' speed may change with it."""
        self.training = training
        if self.p.server.while_training != 1.0:
            for sid, server in enumerate(self.servers):
                server.advance(self.now)
                self.reschedule(sid)

    def trained_done(self) -> None:
        self.set_training(False)
        self.step += 1  # the learner holds version ``step`` now
        if self.pushing:  # the push before is still loading: this one waits for it
            self.push_waiting = True
        else:
            self.start_push()

    def start_push(self) -> None:
        """Push the learner's version: servers busy ``push_s``, learner ``push_learner_s``."""
        self.pushing = True
        self.push_total += self.p.push_s
        if self.p.push_pauses_generation:
            for sid, server in enumerate(self.servers):
                server.advance(self.now)
                server.paused = True
                self.reschedule(sid)
        self.schedule(self.now + self.p.push_s, _PUSHED, self.step)
        if self.cfg.overlap_push:  # free once the snapshot is taken
            self.schedule(self.now + self.p.push_learner_s, _STEP_END, None)

    def pushed(self, version: int) -> None:
        """Every server serves ``version``: the buffer counts it from now on."""
        self.pushing = False
        self.version = version
        for sid, server in enumerate(self.servers):
            if server.paused:
                server.advance(self.now)
                server.paused = False
                self.reschedule(sid)
        self.buffer.set_version(version)
        if not self.cfg.overlap_push:
            self.step_end()
        elif self.push_waiting:
            self.push_waiting = False
            self.start_push()
        if len(self.step_ends) < self.cfg.steps:
            self.admit()

    def step_end(self) -> None:
        """The loop's step is over: the learner may take the next batch."""
        self.step_ends.append(self.now)
        self.learner_busy = False
        self.batch_may_be_ready = True
        if len(self.step_ends) >= self.cfg.steps:
            self.buffer.close()

    def result(self) -> SimResult:
        end = self.now
        for server in self.servers:
            server.advance(end)
        busy = sum(s.busy_s for s in self.servers) / len(self.servers)
        n = len(self.trained)
        stale = [s for _, _, s in self.trained]
        return SimResult(
            elapsed_s=end,
            steps=len(self.step_ends),
            trained_samples=n,
            trained_tokens=sum(t for t, _, _ in self.trained),
            turns_mean=sum(t for _, t, _ in self.trained) / n if n else 0.0,
            staleness_mean=sum(stale) / n if n else 0.0,
            staleness_max=max(stale, default=0),
            generation_idle_frac=1.0 - busy / end if end else 0.0,
            learner_idle_frac=1.0 - self.train_s / end if end else 0.0,
            train_s=self.train_s,
            push_s=self.push_total,
            generated_tokens=self.generated,
            step_ends=self.step_ends,
        )


def simulate(profile: Profile, cfg: SimConfig, shape: ShapeFn | None = None) -> SimResult:
    """Simulate ``cfg.steps`` training steps of ``cfg`` on the machine ``profile`` describes.

    ``shape`` replaces the profile's episode-length distribution (e.g. to replay the tasks a
    measured run drew); by default each task's length is drawn from the profile with the
    task's own seed, so sync and async runs of one seed see the same tasks.
    """
    return _Sim(profile, cfg, shape).run()
