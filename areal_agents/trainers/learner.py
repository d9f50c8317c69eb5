"""The learner: one FSDP2 rank that recomputes log-probs, computes advantages and the loss from
the algorithms library, and steps the optimizer.

One :class:`Learner` runs per rank (a Ray actor, see :class:`LearnerGroup` in
``trainers/learner_group.py``). Every rank receives the whole batch, shapes its rewards and
loss mask (``trainers/filters.py``) and computes advantages on it (identically on every rank);
rows are split over ranks by tokens, and each micro-batch's loss uses the *global* normaliser
of its minibatch (``losses.aggregation_normalizer``), times the world size (FSDP averages
gradients over ranks): the update is the same for any number of ranks and any micro-batch
budget, up to floating-point summation order. What to compute before the first update
(proximal and reference log-probs, critic values) is what ``AlgoConfig.needs`` says, from the
declarations of the chosen loss and estimator. With ``algo.baseline=running`` the learner owns
the :class:`~areal_agents.trainers.advantages.RunningBaseline` and checkpoints it.

The forward passes themselves (log-probs, entropies, values; the no-grad ones before the first
update) are ``trainers/forward.py``'s: with ``trainer.share_prompt_prefix`` a micro-batch's
rows run the prompt prefix they share once, and micro-batches are planned by the tokens so
forwarded (``learner/forward_tokens``, per update, all ranks).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from areal_agents.cpus import pin_process
from areal_agents.net import free_port
from areal_agents.trainers import fsdp
from areal_agents.trainers.advantages import RunningBaseline, compute_advantages
from areal_agents.trainers.algorithms import AlgoConfig, Needs
from areal_agents.trainers.batching import (
    Batch,
    collate,
    plan,
    split_minibatches,
    token_staleness,
)
from areal_agents.trainers.config import ModelConfig, TrainerConfig
from areal_agents.trainers.corrections import weight_summary
from areal_agents.trainers.critic import compute_value_loss
from areal_agents.trainers.filters import max_variance_rows, shape_batch
from areal_agents.trainers.forward import (
    Prepass,
    critic_values,
    micro_batch_cost,
    prepass,
    token_logprobs,
)
from areal_agents.trainers.learner_state import LearnerState
from areal_agents.trainers.lora import apply_lora
from areal_agents.trainers.losses import aggregation_normalizer, compute_policy_loss
from areal_agents.trainers.modeling import ValueModel, decoder_layers, load_policy
from areal_agents.trainers.precision import mixed_precision
from areal_agents.trainers.probe import KLBrake, PolicyProbe
from areal_agents.trainers.replay import ReplayRow, replay_backward, replay_chunk
from areal_agents.types import Trajectory

__all__ = ["Learner", "LearnerSpec"]

_EXTREMES = ("/min", "/max")
"""Metric keys that are a least or most value (``ratio/min``): reduced by min or max over the
step's micro-batches, updates and ranks, where other keys are token means."""


def _keep_extreme(acc: dict[str, float], key: str, value: float) -> None:
    """Fold ``value`` into ``acc[key]``, an :data:`_EXTREMES` key: the least for ``/min``, the
    most for ``/max``."""
    pick = min if key.endswith("/min") else max
    acc[key] = pick(acc[key], value) if key in acc else value


@dataclass(frozen=True)
class LearnerSpec:
    """What a rank needs to build itself (picklable; sent to Ray actors)."""

    model_dir: str
    algo: AlgoConfig
    trainer: TrainerConfig
    model: ModelConfig
    temperature: float
    rank: int
    world_size: int
    use_gpu: bool = False
    max_response_tokens: int | None = None
    """The per-turn token limit of the rollouts (``inference.max_tokens``; overlong penalty)."""
    replay: tuple[ReplayRow, ...] = ()
    """The demonstration replay pool (``algo.replay_coef``; ``trainers/replay.py``)."""
    replay_batch: int = 4
    """Replayed demonstrations per update (``warm_start.batch_size``)."""


def _lr_factor(cfg: TrainerConfig, step: int) -> float:
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.lr_schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class _DecoupledSGD(torch.optim.SGD):
    """SGD whose weight decay shrinks each weight by ``lr * weight_decay`` a step before the
    gradient step (decoupled, as AdamW's), not by adding ``weight_decay * w`` to the
    gradient."""

    def __init__(self, params: Any, *, lr: float, momentum: float, weight_decay: float):
        super().__init__(params, lr=lr, momentum=momentum, foreach=False)
        self.decay = weight_decay

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if self.decay:
            for group in self.param_groups:
                for p in group["params"]:
                    p.mul_(1.0 - group["lr"] * self.decay)
        return super().step(closure)


class Learner(LearnerState):
    """One rank of the FSDP2 learner."""

    def __init__(self, spec: LearnerSpec) -> None:
        pin_process(spec.trainer.learner_cpus)  # its cores, before torch starts its threads
        if spec.trainer.torch_threads is not None:  # before any parallel work in this process
            torch.set_num_threads(spec.trainer.torch_threads)
        self.spec = spec
        self.step = 0
        self.device = torch.device("cpu")
        self.model: Any = None
        self.critic: ValueModel | None = None
        self.ref: Any = None
        self.updates_per_step = spec.trainer.ppo_epochs * spec.trainer.minibatches
        self.needs: Needs = spec.algo.needs(self.updates_per_step)
        self.baseline = RunningBaseline() if spec.algo.baseline == "running" else None
        self.probe = PolicyProbe(
            spec.trainer.probe_tokens, spec.temperature, share=spec.trainer.share_prompt_prefix
        )
        self.brake = KLBrake(spec.trainer.target_kl)
        self._log_weights: list[Tensor] = []  # this step's step-start / behaviour log-weights
        self._record_weights = False  # while the first pass over the batch runs

    # ---- set-up ----------------------------------------------------------------------------

    def address(self) -> str:
        """The address other ranks reach this one at (loopback for a local Ray instance)."""
        import ray

        ip = ray.util.get_node_ip_address()
        return "127.0.0.1" if ip in ("127.0.0.1", "localhost") else ip

    def free_port(self) -> int:
        return free_port(self.address())

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group, load and shard the models, build the optimizers."""
        spec, cfg = self.spec, self.spec.trainer
        self.device = fsdp.init_distributed(
            spec.rank, spec.world_size, master_addr, master_port, use_gpu=spec.use_gpu
        )
        torch.manual_seed(cfg.seed)
        path = Path(spec.model_dir)
        model = load_policy(path, spec.model.dtype, spec.model.gradient_checkpointing)
        self.config = model.config
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        self.lora = spec.model.lora if spec.model.lora.enabled else None
        if self.lora is not None:  # only the adapters train (trainers/lora.py)
            apply_lora(model, self.lora)
        model.to(self.device)
        mixed_precision(model, spec.model.compute_dtype, self.device.type)
        self.model = fsdp.shard_model(model, decoder_layers(model))
        self.optimizer = self._optimizer([p for p in self.model.parameters() if p.requires_grad])
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: _lr_factor(cfg, s) * self.brake.scale
        )
        if self.needs.critic:
            critic = ValueModel(path, spec.model.dtype).to(self.device)
            mixed_precision(critic, spec.model.compute_dtype, self.device.type)
            self.critic = fsdp.shard_model(critic, critic.layers)  # type: ignore[assignment]
            self.critic_optimizer = self._adamw(critic.parameters())
        if self.needs.reference and self.lora is None:  # with LoRA: the adapters switched off
            ref = load_policy(path, spec.model.dtype).to(self.device)
            mixed_precision(ref, spec.model.compute_dtype, self.device.type)
            ref.requires_grad_(False)
            self.ref = fsdp.shard_model(ref, decoder_layers(ref))
        return {
            "params": sum(p.numel() for p in model.parameters()),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "device": str(self.device),
            "torch_threads": torch.get_num_threads(),
        }

    def _optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The policy's optimizer (``trainer.optimizer``); the critic's is always AdamW."""
        cfg = self.spec.trainer
        if cfg.optimizer == "sgd":
            # decoupled weight decay, as AdamW's: the shrink lr * weight_decay a step
            return _DecoupledSGD(
                params, lr=cfg.lr, momentum=cfg.sgd_momentum, weight_decay=cfg.weight_decay
            )
        return self._adamw(params)

    def _adamw(self, params: Any) -> torch.optim.Optimizer:
        cfg = self.spec.trainer
        betas = (float(cfg.betas[0]), float(cfg.betas[1]))
        # foreach=False: the multi-tensor path allocates temporaries as large as the model
        # (about 1 GB more peak memory on SmolLM2-135M); on CPU it is hardly faster.
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, foreach=False
        )

    # ---- one training step -----------------------------------------------------------------

    def train_step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One optimizer step (or ``epochs x minibatches`` updates) on ``trajectories``."""
        spec, cfg, algo = self.spec, self.spec.trainer, self.spec.algo
        batch = collate(trajectories, self.pad_id)
        self.probe.fix(batch)  # the first batch's policy tokens, kept for the whole run
        self.probe.before(self.model, self.device)
        rewards, loss_mask, shaped = shape_batch(
            algo,
            batch.rewards,
            batch.loss_mask,
            batch.truncated,
            spec.max_response_tokens,
            shuffle_seed=cfg.seed * 1_000_003 + self.step,  # the placebo's draw, per step
            group_ids=batch.group_ids,
        )
        batch = dataclasses.replace(batch, rewards=rewards, loss_mask=loss_mask)
        if algo.keep_per_group is not None:  # PODS: each group's most varied rewards only
            kept = max_variance_rows(
                batch.rewards, batch.group_ids, algo.keep_per_group, seed=cfg.seed + self.step
            )
            shaped["filter/downsampled_rows"] = float(len(trajectories) - len(kept))
            batch = batch.rows(kept)
        everything = list(range(len(batch.group_ids)))
        budget, cost = cfg.micro_batch_tokens, micro_batch_cost(batch, cfg.share_prompt_prefix)
        everyone = plan(everything, batch.lengths, spec.world_size, spec.rank, budget, cost)
        pre = self._prepass(batch, everyone)
        adv, returns = compute_advantages(
            algo,
            batch.rewards,
            batch.loss_mask,
            batch.group_ids,
            pre.old_values,
            behavior_logprobs=batch.behavior_logprobs,
            ref_logprobs=pre.ref_logprobs,
            baseline=self.baseline,
        )
        sums: dict[str, float] = defaultdict(float)
        minibatches = split_minibatches(batch.group_ids, cfg.minibatches)
        live = self._live_rows(adv, batch.loss_mask)
        self._log_weights = []
        updates = 0
        for epoch in range(cfg.ppo_epochs):
            self._record_weights = epoch == 0  # the data against the step-start policy
            for rows in minibatches:
                # rows whose loss is 0 everywhere are not forwarded; they still count in the
                # normaliser below, so the update is exactly the one with them
                forward = [r for r in rows if r in live]
                mbs = plan(forward, batch.lengths, spec.world_size, spec.rank, budget, cost)
                norm = float(
                    aggregation_normalizer(
                        batch.loss_mask[rows], algo.aggregation, norm_tokens=algo.norm_tokens
                    )
                )
                self.optimizer.zero_grad(set_to_none=True)
                if self.critic is not None:
                    self.critic_optimizer.zero_grad(set_to_none=True)
                for mb in mbs:
                    self._micro_step(batch, mb, adv, returns, pre, norm, sums)
                if algo.replay_coef > 0:  # the anchor: every update, the next demonstrations
                    update = self.step * self.updates_per_step + updates  # resumes in place
                    chunk = replay_chunk(spec.replay, update, spec.replay_batch)
                    nll = replay_backward(self.model, chunk, algo.replay_coef, self.device)
                    sums["replay/nll"] += nll / spec.world_size  # each rank: the same chunk
                updates += 1
                # an update with no data (no row to train on any rank: ``forward`` is global,
                # and no replay) is not taken; the share of such updates is logged
                data = bool(forward) or algo.replay_coef > 0
                sums["grad_norm"] += self._clip_and_step(self.model, self.optimizer, data)
                sums["learner/updates_skipped_frac"] += float(not data)
                if self.critic is not None:
                    sums["value/grad_norm"] += self._clip_and_step(
                        self.critic, self.critic_optimizer
                    )
        update_kl = self.probe.after(self.model, self.device)  # how far this step moved it
        lr = float(self.scheduler.get_last_lr()[0])  # what this step's updates used
        self.brake.update(update_kl)  # the trust region: the next step's lr scale
        with warnings.catch_warnings():  # a first step with no data took no optimizer step;
            # the schedule still advances with the step count, which is what is wanted
            warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()
        metrics = self._reduce(sums, self.updates_per_step)
        metrics.update(shaped)
        metrics.update(self._weight_metrics())
        if batch.versions is not None:
            metrics.update(token_staleness(batch.versions, batch.loss_mask, self.step))
        self.step += 1
        if update_kl is not None:
            metrics["policy/update_kl"] = update_kl
        metrics["learner/lr_scale"] = self.brake.scale
        metrics["lr"] = lr
        mask_total = batch.loss_mask.sum().clamp(min=1)
        metrics["advantage/abs_mean"] = float(adv.abs().sum() / mask_total)
        metrics["learner/rows_trained"] = float(len(live))
        metrics["learner/rows_skipped"] = float(len(everything) - len(live))
        if self.baseline is not None:
            metrics["baseline/running"] = self.baseline.value
        return metrics

    def _live_rows(self, adv: Tensor, mask: Tensor) -> set[int]:
        """The rows whose loss can be non-zero: every row when a term other than the policy
        gradient reads it (a critic, a KL to the reference in the loss, an entropy bonus),
        else the rows with a non-zero advantage on a policy token (GRPO's uniform groups have
        none: their forward and backward passes would add exactly 0 to the gradient)."""
        algo = self.spec.algo
        if self.critic is not None or algo.entropy_coef > 0:
            return set(range(adv.shape[0]))
        if algo.kl_coef > 0 and not algo.kl_in_reward:
            return set(range(adv.shape[0]))
        nonzero = ((adv != 0) & (mask > 0)).any(dim=1)  # [B]
        return {int(i) for i in torch.nonzero(nonzero).flatten().tolist()}

    def _prepass(self, batch: Batch, mbs: list[list[int]]) -> Prepass:
        """What ``self.needs`` asks for before the first update (``forward.prepass``)."""
        return prepass(
            self.needs,
            batch,
            mbs,
            policy=self.model,
            reference=self.ref,  # None with LoRA: the policy with its adapters off
            critic=self.critic,
            temperature=self.spec.temperature,
            device=self.device,
            share=self.spec.trainer.share_prompt_prefix,
            world_size=self.spec.world_size,
        )

    def _micro_step(
        self,
        batch: Batch,
        rows: list[int],
        adv: Tensor,
        returns: Tensor | None,
        pre: Prepass,
        norm: float,
        sums: dict[str, float],
    ) -> None:
        spec, algo = self.spec, self.spec.algo
        mb = batch.rows(rows)
        w = mb.loss_mask.shape[1]
        dev = self.device

        def take(t: Tensor) -> Tensor:
            return (t[rows, :w] if rows else torch.zeros_like(mb.loss_mask)).to(dev)

        def maybe(t: Tensor | None) -> Tensor | None:
            return None if t is None else take(t)

        mask = mb.loss_mask.to(dev)
        share = spec.trainer.share_prompt_prefix
        out = token_logprobs(
            self.model,
            mb,
            spec.temperature,
            device=dev,
            share=share,
            entropy=True,
            entropy_grad=algo.entropy_coef > 0,
        )
        # proximal: recomputed when the loss asked for it, else the loss's own choice (None)
        loss, metrics = compute_policy_loss(
            algo,
            out.logprobs,
            maybe(pre.proximal_logprobs),
            mb.behavior_logprobs.to(dev),
            take(adv),
            mask,
            ref_logprobs=maybe(pre.ref_logprobs),  # in the loss unless algo.kl_in_reward
            entropy=out.entropy,
            normalizer=norm,
        )
        (loss * spec.world_size).backward()
        if self._record_weights and rows:
            start = pre.proximal_logprobs[rows, :w] if pre.proximal_logprobs is not None else None
            start = out.logprobs.detach().float().cpu() if start is None else start
            on = mb.loss_mask > 0
            self._log_weights.append((start - mb.behavior_logprobs)[on])
        if self.critic is not None and returns is not None and pre.old_values is not None:
            values = critic_values(self.critic, mb, device=dev, share=share)
            vloss, vmetrics = compute_value_loss(
                algo,
                values,
                take(pre.old_values),
                take(returns),
                mask,
                normalizer=norm,
            )
            (vloss * spec.world_size).backward()
            metrics.update(vmetrics)
        tokens = float(mask.sum())
        for key, value in metrics.items():
            v = float(value.detach())
            if key.startswith("loss/"):
                sums[key] += v  # already normalised globally: micro-batch terms add up
            elif key.endswith("_seqs"):  # a count: summed over micro-batches and ranks
                sums[key + "@w"] += v
            elif not tokens:
                continue  # a mean, least or most over no token: nothing measured
            elif key.endswith(_EXTREMES):  # the step's least / most, not a mean of them
                _keep_extreme(sums, key, v)
            else:
                sums[key + "@w"] += v * tokens
        sums["@tokens"] += tokens
        sums["learner/forward_tokens"] += out.tokens  # summed over ranks, per update

    def _weight_metrics(self) -> dict[str, float]:
        """Importance-weight quantiles and the behaviour KL of the step's whole batch (every
        rank's tokens gathered): the data against the step-start policy, whatever the loss."""
        local = torch.cat(self._log_weights) if self._log_weights else torch.zeros(0)
        gathered: list[Any] = [None] * self.spec.world_size
        dist.all_gather_object(gathered, local)
        self._log_weights = []
        return weight_summary(torch.cat([g for g in gathered if g is not None]))

    def _clip_and_step(
        self, model: Any, optimizer: torch.optim.Optimizer, data: bool = True
    ) -> float:
        """Clip the gradients and step; returns their norm (over every rank). Without
        ``data`` (no row trained on any rank; the empty micro-batches still ran a backward
        pass for FSDP's collectives and left zero gradients) the optimizer does not step: an
        AdamW step on zero gradients would still move every weight by its momentum (and its
        weight decay), an update with nothing behind it, as a gradient of None does not."""
        max_norm = self.spec.trainer.max_grad_norm
        params = [p for p in model.parameters() if p.grad is not None]
        norm: Any = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        if data:
            optimizer.step()
        return float(norm)

    def _reduce(self, sums: dict[str, float], updates: int) -> dict[str, float]:
        keys = sorted(sums)
        gathered: list[Any] = [None] * self.spec.world_size
        dist.all_gather_object(gathered, {k: sums[k] for k in keys})
        total: dict[str, float] = defaultdict(float)
        for part in gathered:
            for k, v in part.items():
                if k.startswith(("grad_norm", "value/grad_norm", "learner/updates_skipped")):
                    total[k] = v  # the same on every rank
                elif k.endswith(_EXTREMES):  # over every rank's micro-batches
                    _keep_extreme(total, k, v)
                else:
                    total[k] += v
        tokens = total.pop("@tokens", 0.0)
        out: dict[str, float] = {}
        for k, v in total.items():
            if k.endswith(_EXTREMES):
                out[k] = v
            elif k.endswith("_seqs@w"):  # a count per micro-batch: summed, per update
                out[k[:-2]] = v / updates
            elif k.endswith("@w"):
                if tokens:  # token means; none at all on a step with nothing to train
                    out[k[:-2]] = v / tokens
            elif k.startswith("loss/"):
                out[k] = v / updates
            else:
                out[k] = v / updates
        return out

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
