"""Simulate the trainer's scheduling before renting a cluster.

:func:`simulate` drives the trainer's own :class:`~areal_agents.trainers.buffer.TrajectoryBuffer`
(admission under the staleness bound, batch order) in simulated time, with servers, a learner
and episode lengths described by a :class:`Profile` (``profiles/*.yaml``). The command line is
``python -m areal_agents.simulate``.

>>> from areal_agents.simulation import SimConfig, load_profile, simulate
>>> r = simulate(load_profile("cpu_2core_builtin"), SimConfig(mode="sync", steps=2))
>>> (r.steps, r.trained_samples, r.staleness_max)
(2, 16, 0)
"""

from __future__ import annotations

from areal_agents.simulation.engine import EpisodeShape, ShapeFn, SimConfig, SimResult, simulate
from areal_agents.simulation.from_run import profile_from_rows, profile_from_run
from areal_agents.simulation.profile import (
    EpisodeProfile,
    LearnerProfile,
    Profile,
    ServerProfile,
    available_profiles,
    load_profile,
)

__all__ = [
    "EpisodeProfile",
    "EpisodeShape",
    "LearnerProfile",
    "Profile",
    "ServerProfile",
    "ShapeFn",
    "SimConfig",
    "SimResult",
    "available_profiles",
    "load_profile",
    "profile_from_rows",
    "profile_from_run",
    "simulate",
]
