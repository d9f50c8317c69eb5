"""Training: losses, advantages, the trajectory buffer, learners, rollout workers, the loop.

Names are imported lazily (``from areal_agents.trainers import train`` loads Ray and torch only
then), so the pure pieces — buffer, task stream, checkpoints, config — stay cheap to import.

=====================  ============================================================
``config``             :class:`TrainConfig` and its sections (the command line's keys)
``data``               :class:`TaskStream`: reproducible task order with a cursor
``buffer``             :class:`TrajectoryBuffer`: staleness bound, admission order
``curriculum``         which task a group trains on (``algo.task_sampling``)
``rollout_worker``     :class:`RolloutWorker`: concurrent episodes -> trajectory groups
``batching``           trajectories -> padded tensors and log-probs; ranks, micro-batches
``forward``            the learner's forward passes; a shared prompt prefix runs once
``filters``            overlong penalty and filtering on a batch (DAPO)
``learner``            :class:`Learner`: one FSDP2 rank (logprobs, advantages, loss, step)
``learner_group``      :class:`LearnerGroup`: the ranks as Ray actors
``inference``          servers for training and :class:`WeightSync` (the weight push)
``checkpoint``         atomic checkpoint directories, RNG capture
``metrics``            ``metrics.jsonl``, TensorBoard, transcripts, summary + PNG
``loop``               :func:`train`: the main loop
``held_out``           held-out success before and after, paired; the closing screen
``selection``          the final policy, chosen among steps on validation tasks
``algorithms``         :class:`AlgoConfig`, presets, what an algorithm needs
``advantages``         advantage estimators and ``compute_advantages``
``losses``             policy losses, ``aggregate`` and ``compute_policy_loss``
``critic``             the value loss (PPO)
``replay``             the warm start's demonstrations replayed during RL (PPO-ptx)
``masked``             statistics over the policy tokens
=====================  ============================================================
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AlgoConfig",
    "Learner",
    "LearnerGroup",
    "RolloutWorker",
    "TaskStream",
    "TrainConfig",
    "TrajectoryBuffer",
    "WeightSync",
    "train",
]

_WHERE = {
    "AlgoConfig": "algorithms",
    "Learner": "learner",
    "LearnerGroup": "learner_group",
    "RolloutWorker": "rollout_worker",
    "TaskStream": "data",
    "TrainConfig": "config",
    "TrajectoryBuffer": "buffer",
    "WeightSync": "inference",
    "train": "loop",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'areal_agents.trainers' has no attribute {name!r}")
    return getattr(importlib.import_module(f"areal_agents.trainers.{_WHERE[name]}"), name)
