"""What the simulator knows about a machine: a profile of measured (or published) numbers.

A profile is a YAML (or JSON) file with four sections, each number's source said in the file:

- ``server``: one inference server's generation throughput (policy tokens per second, summed
  over its requests) at a few concurrencies; in between it is interpolated linearly, below the
  first point it scales in proportion to the concurrency, above the last it stays flat.
  ``efficiency`` scales the whole curve (what a training run reaches of a benchmark's figure)
  and ``while_training`` scales it while the learner trains (cores shared with the learner).
- ``episode``: the length distribution — assistant turns per episode (``{turns: weight}``,
  shared by every sample of a group when ``turns_shared_by_group``), policy tokens per turn
  (``{tokens: weight}``) and the time between two turns spent outside the server
  (``env_step_s``: the environment, a tool call).
- ``learner``: training time of one step, ``step_s + token_s * policy_tokens``, divided by
  ``1 + scaling_efficiency * (learners - 1)`` with more learner ranks.
- ``push_s``: one weight push (every server at once); ``push_pauses_generation`` stops the
  servers meanwhile; ``push_learner_s`` (default 0) is the part of it that holds the learner.

The shipped profiles live next to this module (``profiles/*.yaml``);
:func:`load_profile` takes their name or a path.

>>> p = load_profile("cpu_2core_builtin")
>>> p.server.tokens_per_s(1) == p.server.throughput[0]  # measured at 1 episode
True
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from areal_agents.errors import ConfigError

__all__ = [
    "EpisodeProfile",
    "LearnerProfile",
    "Profile",
    "ServerProfile",
    "available_profiles",
    "load_profile",
]


@dataclass(frozen=True)
class ServerProfile:
    """One inference server's throughput against the number of episodes it serves at once."""

    concurrency: tuple[int, ...]
    """Concurrent episodes at which the throughput was measured (increasing)."""
    throughput: tuple[float, ...]
    """Policy tokens per second, all requests together, at each of ``concurrency``."""
    efficiency: float = 1.0
    """Share of that throughput reached in training (longer prompts, the rollout process)."""
    while_training: float = 1.0
    """Throughput multiplier while the learner trains (servers and learner share a machine)."""

    def __post_init__(self) -> None:
        if not self.concurrency or len(self.concurrency) != len(self.throughput):
            raise ConfigError("server.concurrency and server.throughput need equal, >0 lengths")
        if list(self.concurrency) != sorted(set(self.concurrency)) or self.concurrency[0] < 1:
            raise ConfigError(f"server.concurrency={self.concurrency}: must increase from >= 1")
        if min(self.throughput) <= 0:
            raise ConfigError(f"server.throughput={self.throughput}: must be positive")
        if not 0 < self.efficiency <= 1 or not 0 < self.while_training <= 1:
            raise ConfigError("server.efficiency and server.while_training: in (0, 1]")

    def tokens_per_s(self, active: int) -> float:
        """Total throughput with ``active`` requests in flight (0 when none)."""
        if active <= 0:
            return 0.0
        c, t = self.concurrency, self.throughput
        if active <= c[0]:
            return t[0] * active / c[0]
        if active >= c[-1]:
            return t[-1]
        i = bisect.bisect_right(c, active)
        frac = (active - c[i - 1]) / (c[i] - c[i - 1])
        return t[i - 1] + frac * (t[i] - t[i - 1])


@dataclass(frozen=True)
class EpisodeProfile:
    """The length of an episode: turns, policy tokens per turn, time between turns."""

    turns: Mapping[int, float]
    """Assistant turns per episode -> weight."""
    tokens_per_turn: Mapping[float, float]
    """Policy tokens sampled per turn -> weight."""
    env_step_s: float = 0.0
    """Seconds between two turns outside the server (environment step, tool call)."""
    turns_shared_by_group: bool = True
    """Every sample of a group has the same number of turns (one task, one length)."""

    def __post_init__(self) -> None:
        for name in ("turns", "tokens_per_turn"):
            dist = getattr(self, name)
            if not dist or min(dist) <= 0 or min(dist.values()) < 0 or sum(dist.values()) <= 0:
                raise ConfigError(f"episode.{name}={dict(dist)}: needs positive values, weights")
        if self.env_step_s < 0:
            raise ConfigError(f"episode.env_step_s={self.env_step_s}: must be >= 0")

    @property
    def mean_turns(self) -> float:
        return _mean(self.turns)

    @property
    def mean_tokens_per_turn(self) -> float:
        return _mean(self.tokens_per_turn)


@dataclass(frozen=True)
class LearnerProfile:
    """Training time of one step."""

    step_s: float
    """Seconds per step whatever its size (forward of the reference, optimizer, overheads)."""
    token_s: float
    """Seconds per trained policy token (one rank)."""
    scaling_efficiency: float = 0.9
    """Each extra learner rank adds this fraction of one rank's speed."""

    def __post_init__(self) -> None:
        if self.step_s < 0 or self.token_s < 0 or not 0 <= self.scaling_efficiency <= 1:
            raise ConfigError("learner: step_s, token_s >= 0 and 0 <= scaling_efficiency <= 1")

    def train_s(self, tokens: int, learners: int = 1) -> float:
        """Seconds to train ``tokens`` policy tokens on ``learners`` ranks."""
        speed = 1.0 + self.scaling_efficiency * (max(1, learners) - 1)
        return (self.step_s + self.token_s * tokens) / speed


@dataclass(frozen=True)
class Profile:
    """Everything the simulator needs to know about a machine."""

    name: str
    server: ServerProfile
    episode: EpisodeProfile
    learner: LearnerProfile
    push_s: float
    """Seconds of one weight push, from the learner's snapshot to every server serving it."""
    push_learner_s: float = 0.0
    """The part of ``push_s`` that holds the learner (taking the snapshot of its weights)."""
    push_pauses_generation: bool = True
    """Whether the servers stop generating while they load new weights."""
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Where each number comes from."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """Build a profile from the parsed file (see the module docstring for the keys)."""
        try:
            s, e, lrn = data["server"], data["episode"], data["learner"]
            return cls(
                name=str(data.get("name", "profile")),
                server=ServerProfile(
                    concurrency=tuple(int(c) for c in s["concurrency"]),
                    throughput=tuple(float(t) for t in s["tokens_per_s"]),
                    efficiency=float(s.get("efficiency", 1.0)),
                    while_training=float(s.get("while_training", 1.0)),
                ),
                episode=EpisodeProfile(
                    turns={int(k): float(v) for k, v in e["turns"].items()},
                    tokens_per_turn=_dist(e["tokens_per_turn"]),
                    env_step_s=float(e.get("env_step_s", 0.0)),
                    turns_shared_by_group=bool(e.get("turns_shared_by_group", True)),
                ),
                learner=LearnerProfile(
                    step_s=float(lrn["step_s"]),
                    token_s=float(lrn["token_s"]),
                    scaling_efficiency=float(lrn.get("scaling_efficiency", 0.9)),
                ),
                push_s=float(data["push_s"]),
                push_learner_s=float(data.get("push_learner_s", 0.0)),
                push_pauses_generation=bool(data.get("push_pauses_generation", True)),
                description=str(data.get("description", "")).strip(),
                sources={str(k): str(v).strip() for k, v in (data.get("sources") or {}).items()},
            )
        except KeyError as err:
            raise ConfigError(f"profile {data.get('name', '?')}: missing key {err}") from None


def available_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    folder = resources.files("areal_agents.simulation") / "profiles"
    return sorted(p.name.rsplit(".", 1)[0] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (``cpu_2core_builtin``) or a YAML/JSON file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json") and path.exists():
        text = path.read_text()
    elif str(name_or_path) in available_profiles():
        folder = resources.files("areal_agents.simulation") / "profiles"
        text = (folder / f"{name_or_path}.yaml").read_text()
    else:
        raise ConfigError(
            f"profile {str(name_or_path)!r}: no such file, and not one of {available_profiles()}"
        )
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return Profile.from_dict(data)


def _dist(value: Any) -> dict[float, float]:
    """``{value: weight}`` from a mapping or from one number (a fixed value)."""
    if isinstance(value, Mapping):
        return {float(k): float(v) for k, v in value.items()}
    return {float(value): 1.0}


def _mean(dist: Mapping[Any, float]) -> float:
    total = sum(dist.values())
    return sum(float(k) * w for k, w in dist.items()) / total
