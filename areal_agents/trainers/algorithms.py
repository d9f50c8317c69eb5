"""The algorithm config, its presets, and what it needs from a learner.

An algorithm is a small frozen dataclass of knobs (:class:`AlgoConfig`) that names an advantage
estimator and a policy loss from the registries in :mod:`~areal_agents.trainers.advantages` and
:mod:`~areal_agents.trainers.losses`. ``AlgoConfig.from_name`` holds the presets, so that the
command line can say ``algo=dapo algo.clip_eps_high=0.3``. :meth:`AlgoConfig.needs` tells a
learner what to compute before a step (proximal log-probs, reference log-probs, critic values),
from what the chosen loss and estimator declare; the learner never branches on their names.

The three calls a learner makes live next to what they compute and are re-exported here:
:func:`~areal_agents.trainers.advantages.compute_advantages`,
:func:`~areal_agents.trainers.losses.compute_policy_loss` and
:func:`~areal_agents.trainers.critic.compute_value_loss`.

All token tensors are right-padded ``[B, T]`` and the functions are position-agnostic: pass every
token tensor in one alignment (the learner uses the predicted-token positions, already shifted).
``mask`` is 1 on policy tokens only; in multi-turn rows it has zeros in the middle (tool tokens),
and nothing — advantage, loss, KL or entropy — flows through a position where it is 0.

>>> import torch
>>> cfg = AlgoConfig.from_name("grpo")
>>> mask = torch.ones(4, 2)
>>> adv, ret = compute_advantages(cfg, torch.tensor([1.0, 0.0, 1.0, 1.0]), mask, "aabb")
>>> [round(a, 4) for a in adv[:, 0].tolist()], ret
([0.7071, -0.7071, 0.0, 0.0], None)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.trainers.advantages import (
    compute_advantages,
    get_advantage_estimator,
    register_advantage_estimator,
)
from areal_agents.trainers.corrections import IMP_AGGS, IMP_LEVELS, IMP_MODES
from areal_agents.trainers.critic import compute_value_loss
from areal_agents.trainers.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    KL_ROWS,
    compute_policy_loss,
    get_loss,
    register_loss,
    resolve_loss,
)

__all__ = [
    "PRESETS",
    "TASK_SAMPLING",
    "AlgoConfig",
    "Needs",
    "compute_advantages",
    "compute_policy_loss",
    "compute_value_loss",
    "get_advantage_estimator",
    "get_loss",
    "register_advantage_estimator",
    "register_loss",
]

_BASELINES = ("batch", "running", "none")
_STD_SCOPES = ("group", "batch")
TASK_SAMPLING = ("uniform", "learnability")
"""The choices of ``algo.task_sampling``."""


@dataclass(frozen=True)
class Needs:
    """What a learner computes before a step's first update, as the algorithm declares it."""

    proximal_pass: bool
    """Recompute the proximal log-probs in a no-grad pass (the loss's ``step_start`` policy,
    with more than one update per step)."""
    reference: bool
    """Reference-policy log-probs (the KL term, in the loss or in the reward)."""
    critic: bool
    """A value model and its values (the advantage estimator reads them)."""


@dataclass(frozen=True)
class AlgoConfig:
    """Knobs of one RL algorithm. Select a preset with ``algo=NAME``; override any field."""

    name: str = "grpo"
    """Preset this config came from (a label; the fields below decide the behaviour)."""
    advantage: str = "grpo"
    """Estimator: gae | grpo | dr_grpo | reinforce | rloo | reinforce_pp (or a registered one)."""
    loss: str = "auto"
    """Policy loss: auto | ppo_clip | decoupled_ppo | reinforce (or registered). ``auto`` is
    ``decoupled_ppo`` with ``trainer.mode=async`` and ``ppo_clip`` in sync: with stale samples,
    clipping against the sampling policy (``ppo_clip``) learned slower the staler the data,
    the decoupled loss did not (``losses.AUTO_LOSS``; ``benchmarks/decoupled_vs_naive.py``)."""
    clip_eps_low: float = 0.2
    """PPO clip below 1: ratios under ``1 - clip_eps_low`` stop pushing down a bad token."""
    clip_eps_high: float = 0.2
    """PPO clip above 1 (DAPO clip-higher uses 0.28)."""
    dual_clip_c: float | None = None
    """Dual clip bound ``c > 1`` on negative-advantage tokens (None: off; 3.0 is common)."""
    behavior_imp_cap: float | None = 5.0
    """Cap on the behaviour weight ``pi_prox / pi_behav`` (decoupled_ppo, reinforce; see
    ``trainers/corrections.py``); None: no cap."""
    behavior_imp_mode: str = "mask"
    """Above the cap: ``mask`` (weight 0: the token, turn or sequence is dropped; AReaL's token
    masking, MIS at turn/sequence level) or ``truncate`` (min(w, cap), truncated IS, which
    keeps a token whose weight is in the thousands at weight ``cap``). ``mask`` is the default:
    on the fair async benchmark the cap never bound (behaviour weights at most 3.1, held-out
    parity with sync either way), and where it binds (``benchmarks/decoupled_vs_naive.py``,
    staleness 8 and 16 at lr 0.5, 3 seeds) masking ended 1.0 and 3.2 points of reward above
    truncation, for 1.3 and 0.8 points less mean reward on the way (``benchmarks/README.md``,
    section 13)."""
    behavior_imp_level: str = "token"
    """What one behaviour weight covers: ``token``, ``turn`` (an assistant turn's tokens share
    one weight) or ``sequence`` (the whole episode's policy tokens share one)."""
    behavior_imp_agg: str = "geometric"
    """How a turn's or sequence's token weights combine: ``geometric`` (their geometric mean)
    or ``product`` (the exact sequence ratio). Ignored at ``behavior_imp_level=token``."""
    behavior_imp_floor: float | None = None
    """Units whose behaviour weight is below this are masked (weight 0); None: no floor."""
    shuffle_rewards: bool = False
    """Placebo: the learner shuffles the rewards (seeded per step) before computing advantages,
    so the update has the real one's size but no signal (``benchmarks/rl_gain.py``)."""
    shuffle_scope: str = "batch"
    """Where the placebo shuffles: ``batch`` (among all the batch's episodes: a group whose
    episodes all earned the same reward usually gets mixed ones, so the placebo also trains
    groups the real run gives no gradient) or ``group`` (within each group: every group keeps
    its own rewards and the real run's advantages, only which episode earned which is drawn at
    random; the same rows train, with the same advantage sizes: drift alone)."""
    aggregation: str = "token_mean"
    """token_mean | seq_mean_token_mean | seq_sum_norm (see ``losses.aggregate``)."""
    norm_tokens: int | None = None
    """Constant per-row length for ``seq_sum_norm`` (Dr. GRPO: the max response length)."""
    kl_coef: float = 0.0
    """Weight of KL(pi || pi_ref); > 0 needs reference log-probs (``needs().reference``)."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 estimator of the KL per token."""
    kl_rows: str = "all"
    """Which rows the KL to the reference (``kl_coef``, in the loss) is a loss on: ``all``, or
    ``no_signal``: only the rows whose advantage is 0 on every policy token (GRPO's groups whose
    episodes all earned the same reward), an anchor where the rewards teach nothing that leaves
    the rows the policy learns from free (``losses.kl_row_mask``). ``kl_ref`` is still measured
    on every row."""
    kl_in_reward: bool = False
    """Fold ``-kl_coef * KL`` into the token rewards (PPO/REINFORCE++) instead of the loss."""
    entropy_coef: float = 0.0
    """Entropy bonus weight: the loss subtracts ``entropy_coef * aggregate(entropy)``."""
    std_normalize: bool = True
    """GRPO: divide centred rewards by their std (Dr. GRPO turns this off)."""
    std_scope: str = "group"
    """GRPO std over the ``group`` or the whole ``batch`` (the centring is always per group)."""
    std_unbiased: bool = True
    """Bessel-corrected std for GRPO (as TRL and torch.std)."""
    adv_eps: float = 1e-6
    """Added to the std before dividing (TRL uses 1e-4)."""
    whiten_advantages: bool = False
    """Whiten the final advantages over all policy tokens of the batch (PPO)."""
    positive_scale: float = 1.0
    """Weight on positive advantages, applied last (after whitening): ``1`` is the estimator's
    own; below 1 the update leans on pushing down the episodes that did worse than their
    baseline (W-REINFORCE with its lambda, Zhu et al., 2025; ``0`` is their negative-sample
    reinforcement). Either scale below 1 breaks GRPO's zero sum within a group: on the code
    task neither sign alone carried the signal, and each one's placebo cost at least the
    recipe's (``benchmarks/README.md``, section 12, "Neither sign of the advantage alone")."""
    negative_scale: float = 1.0
    """Weight on negative advantages, applied last (after whitening): ``1`` is the estimator's
    own, ``0`` learns only from the episodes that did better than their baseline (as
    rejection-sampling fine-tuning, RAFT, weighted by the advantage)."""
    replay_coef: float = 0.0
    """Demonstration replay (InstructGPT's PPO-ptx, with the warm start's data): every update
    adds this times the mean negative log-likelihood of ``warm_start.batch_size`` of the
    environment's demonstrations (``trainers/replay.py``); 0: off. An anchor towards right
    answers, which a reward with no signal does not move. With ``positive_scale`` and
    ``negative_scale`` both 0 the run is the replay alone: the supervised control. Measured on
    the code task (``benchmarks/README.md``, section 12, "Demonstration replay"): at 1 the
    group placebo's cost fell from 28.1 points to 3.1 against that control, and the control
    gained as much as RL with replay (+9.4, +19.5 and +15.6 against +9.4, +17.2 and +18.0 on
    seeds 0, 1 and 2): off by default."""
    replay_demos: int = 64
    """Demonstrations in the replay pool, the warm start's first ones (its default 16 steps of
    4); each update takes the next ``warm_start.batch_size`` of them, cycling."""
    baseline: str = "batch"
    """REINFORCE baseline: batch (mean reward of the batch) | running (EMA) | none."""
    gamma: float = 1.0
    """Discount per policy token (GAE, REINFORCE++)."""
    lam: float = 1.0
    """GAE lambda."""
    vf_coef: float = 0.5
    """Weight of the value loss (``compute_value_loss`` returns it already multiplied)."""
    vf_clip: float | None = 0.2
    """Value clipping range around the old values; None: unclipped."""
    max_log_ratio: float = 20.0
    """Log-ratios are clamped to ``±max_log_ratio`` before ``exp`` (no inf/NaN gradients)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: the buffer drops a group whose rewards are all equal (no learning
    signal) and admits another task in its place."""
    task_sampling: str = "uniform"
    """Which task each new group trains on: ``uniform`` (the task stream's next) or
    ``learnability`` (of 8 candidate tasks, one drawn in proportion to its family's chance of
    a reward spread in its last groups: GRPO learns only from those; before generating, where
    dynamic sampling drops after; ``trainers/curriculum.py``)."""
    keep_per_group: int | None = None
    """Down-sampling (PODS, Xu et al., 2025): of each group's ``env.group_size`` episodes the
    learner trains only this many, those whose rewards vary the most (the lowest and highest
    rewards), and computes the advantages among them; None: every episode. Generation is cheap
    and the update is not: a large group finds the rare success on a hard task, and the learner
    pays for ``keep_per_group`` rows of it (``filters.max_variance_rows``)."""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty: a trajectory whose longest assistant turn comes within N
    tokens of the per-turn limit (``inference.max_tokens``) loses up to ``overlong_penalty``
    of reward, linearly (0: off; ``filters.overlong_penalty``)."""
    overlong_penalty: float = 1.0
    """Largest overlong penalty (reached at the length limit)."""
    mask_truncated: bool = False
    """Overlong filtering: a truncated episode (``max_turns`` reached) gets no loss; its reward
    still counts in its group's baseline (``filters.truncation_mask``)."""

    def __post_init__(self) -> None:
        get_advantage_estimator(self.advantage)
        get_loss(self.loss)
        _choose("aggregation", self.aggregation, AGGREGATIONS)
        _choose("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choose("kl_rows", self.kl_rows, KL_ROWS)
        if self.kl_rows != "all" and (self.kl_coef <= 0 or self.kl_in_reward):
            raise ConfigError(
                f"algo.kl_rows={self.kl_rows} chooses the rows of a KL term in the loss: it needs "
                "algo.kl_coef > 0 and algo.kl_in_reward=false"
            )
        _choose("baseline", self.baseline, _BASELINES)
        _choose("std_scope", self.std_scope, _STD_SCOPES)
        _choose("shuffle_scope", self.shuffle_scope, _STD_SCOPES)
        _choose("task_sampling", self.task_sampling, TASK_SAMPLING)
        _choose("behavior_imp_mode", self.behavior_imp_mode, IMP_MODES)
        _choose("behavior_imp_level", self.behavior_imp_level, IMP_LEVELS)
        _choose("behavior_imp_agg", self.behavior_imp_agg, IMP_AGGS)
        for key in ("clip_eps_low", "clip_eps_high", "kl_coef", "entropy_coef", "vf_coef"):
            if getattr(self, key) < 0:
                raise ConfigError(f"algo.{key}={getattr(self, key)} must be >= 0")
        if self.clip_eps_low >= 1:
            raise ConfigError(f"algo.clip_eps_low={self.clip_eps_low} must be < 1 (try 0.2)")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ConfigError(f"algo.dual_clip_c={self.dual_clip_c} must be > 1 (try 3.0) or none")
        if self.behavior_imp_cap is not None and self.behavior_imp_cap <= 0:
            raise ConfigError(f"algo.behavior_imp_cap={self.behavior_imp_cap} must be > 0 or none")
        floor, cap = self.behavior_imp_floor, self.behavior_imp_cap
        if floor is not None and not 0 < floor < (cap if cap is not None else math.inf):
            raise ConfigError(
                f"algo.behavior_imp_floor={floor} must be > 0 and below algo.behavior_imp_cap="
                f"{cap} (e.g. 0.2 with a cap of 5), or none"
            )
        for key in ("gamma", "lam", "positive_scale", "negative_scale"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"algo.{key}={getattr(self, key)} must be in [0, 1]")
        if self.positive_scale == self.negative_scale == 0.0 and not self.replay_coef:
            raise ConfigError("algo.positive_scale and algo.negative_scale are both 0: no update")
        if self.replay_coef < 0 or self.replay_demos < 1:
            raise ConfigError(
                f"algo.replay_coef={self.replay_coef} must be >= 0 and algo.replay_demos="
                f"{self.replay_demos} at least 1"
            )
        if self.adv_eps <= 0 or self.max_log_ratio <= 0:
            raise ConfigError("algo.adv_eps and algo.max_log_ratio must be > 0")
        if self.vf_clip is not None and self.vf_clip <= 0:
            raise ConfigError(f"algo.vf_clip={self.vf_clip} must be > 0 or none")
        if self.norm_tokens is not None and self.norm_tokens <= 0:
            raise ConfigError(f"algo.norm_tokens={self.norm_tokens} must be > 0 or none")
        if self.overlong_buffer < 0 or self.overlong_penalty < 0:
            raise ConfigError("algo.overlong_buffer and algo.overlong_penalty must be >= 0")
        if self.keep_per_group is not None and self.keep_per_group < 2:
            raise ConfigError(
                f"algo.keep_per_group={self.keep_per_group}: at least 2 episodes of a group are "
                "needed to compare them (or null: train every episode)"
            )

    def needs(self, updates_per_step: int = 1) -> Needs:
        """What a learner computes before a step of ``updates_per_step`` optimizer updates."""
        return Needs(
            proximal_pass=get_loss(self.loss).needs_recompute(updates_per_step),
            reference=self.kl_coef > 0,
            critic=get_advantage_estimator(self.advantage).needs_critic,
        )

    @classmethod
    def from_name(cls, name: str) -> AlgoConfig:
        """The preset ``name``: ppo, grpo, dr_grpo, dapo, reinforce, rloo, reinforce_pp."""
        if name not in PRESETS:
            raise ConfigError(
                f"algo={name!r} is not a known algorithm"
                + did_you_mean(name, PRESETS)
                + f"; choose one of {sorted(PRESETS)}"
            )
        return cls(name=name, **PRESETS[name])

    @classmethod
    def preset_names(cls) -> tuple[str, ...]:
        """The names :meth:`from_name` accepts: the options of the ``algo`` config group."""
        return tuple(PRESETS)

    def for_mode(self, mode: str) -> AlgoConfig:
        """This config with ``loss=auto`` resolved for ``trainer.mode=mode`` (what a learner
        trains with); any other loss is kept."""
        return self.replace(loss=resolve_loss(self.loss, mode))

    def replace(self, **changes: Any) -> AlgoConfig:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)


def _choose(key: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(
            f"algo.{key}={value!r} is not allowed"
            + did_you_mean(value, choices)
            + f"; choose one of {list(choices)}"
        )


#: Preset name -> field values (everything else keeps its default). KL is off everywhere by
#: default (no reference model); turn it on with ``algo.kl_coef=0.04`` (GRPO) or
#: ``algo.kl_coef=0.01`` (REINFORCE++, in the reward).
PRESETS: dict[str, dict[str, Any]] = {
    "ppo": dict(
        advantage="gae", loss="auto", gamma=1.0, lam=0.95,
        whiten_advantages=True, aggregation="token_mean", kl_in_reward=True, kl_estimator="k1",
    ),
    "grpo": dict(advantage="grpo", loss="auto", aggregation="seq_mean_token_mean"),
    "dr_grpo": dict(
        advantage="dr_grpo", loss="auto", std_normalize=False, aggregation="seq_sum_norm"
    ),
    "dapo": dict(
        advantage="grpo", loss="auto", clip_eps_low=0.2, clip_eps_high=0.28,
        aggregation="token_mean", dynamic_sampling=True, mask_truncated=False,
    ),
    "reinforce": dict(advantage="reinforce", loss="reinforce", baseline="batch"),
    "rloo": dict(advantage="rloo", loss="auto", aggregation="token_mean"),
    "reinforce_pp": dict(
        advantage="reinforce_pp", loss="auto", kl_in_reward=True, kl_estimator="k2",
        aggregation="token_mean",
    ),
}  # fmt: skip
