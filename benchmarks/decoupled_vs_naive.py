"""Naive PPO clipping vs the decoupled PPO loss on stale data, at staleness 0, 4 and 8.

The project's own losses (``algo.loss=ppo_clip``: the ratio is taken against the policy that
sampled the tokens; ``algo.loss=decoupled_ppo``: the trust region is taken around the proximal
policy, the weights at the start of the step, and ``pi_prox / pi_behav`` corrects for the stale
sampler) and GRPO advantages (:func:`compute_advantages`) train a small tabular softmax policy
in a controlled setting where the staleness is exact: the batch trained at step ``t`` was
sampled by the weights of step ``t - S`` (the worst case a staleness bound ``S`` allows, every
step). Everything but the loss is the same: tasks, samples (same random stream), optimizer.

The policy: for each of ``--contexts`` tasks and ``--length`` positions, logits over
``--vocab`` tokens; a task's reward is the fraction of positions where the sampled token is the
task's target token (``1 / vocab`` at the start). The expected reward of the weights is
computed exactly, so the curves carry no evaluation noise; each setting runs over ``--seeds``.

This is a measurement of the two losses' behaviour under staleness, not of an LLM: the policy
moves fast (Adam, ``--lr``), so a lag of 4 or 8 versions is a large policy change, which is the
regime where the two objectives differ (AReaL, Fu et al. 2025, section 5).

    python benchmarks/decoupled_vs_naive.py --json benchmarks/results/decoupled_vs_naive.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, write_json

from areal_agents.trainers.algorithms import AlgoConfig, compute_advantages, compute_policy_loss
from areal_agents.trainers.losses import get_loss

__all__ = ["VARIANTS", "expected_reward", "main", "train"]

LOSSES = ("ppo_clip", "decoupled_ppo")
#: The settings compared (``--variants``): a loss and its off-policy correction, as ``algo.*``
#: overrides (``trainers/corrections.py``). ``decoupled_ppo`` alone runs the config's defaults.
VARIANTS: dict[str, dict[str, Any]] = {
    "ppo_clip": {"loss": "ppo_clip"},
    "decoupled_ppo": {"loss": "decoupled_ppo"},
    "decoupled_ppo+truncate": {"loss": "decoupled_ppo", "behavior_imp_mode": "truncate"},
    "decoupled_ppo+mask": {"loss": "decoupled_ppo", "behavior_imp_mode": "mask"},
    "decoupled_ppo+seq_geo_mask": {
        "loss": "decoupled_ppo",
        "behavior_imp_mode": "mask",
        "behavior_imp_level": "sequence",
    },
    "decoupled_ppo+no_cap": {"loss": "decoupled_ppo", "behavior_imp_cap": None},
}


def expected_reward(theta: torch.Tensor, target: torch.Tensor) -> float:
    """Exact expected reward of the policy ``theta`` ``[C, T, V]`` for targets ``[C, T]``."""
    probs = torch.softmax(theta, dim=-1)
    return float(probs.gather(-1, target[..., None]).mean())


def train(
    loss: str,
    staleness: int,
    seed: int,
    *,
    steps: int = 40,
    contexts: int = 16,
    length: int = 8,
    vocab: int = 8,
    tasks_per_step: int = 8,
    group_size: int = 8,
    updates: int = 1,
    lr: float = 0.2,
) -> dict[str, Any]:
    """One run of ``loss`` (a name of :data:`VARIANTS`); returns the expected reward after every
    step and the loss metrics' means."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(vocab, (contexts, length), generator=g)
    theta = torch.zeros(contexts, length, vocab, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=lr)
    cfg = AlgoConfig.from_name("grpo").replace(aggregation="token_mean", **VARIANTS[loss])
    history = [theta.detach().clone()]  # history[v]: the weights of version v
    sample_gen = torch.Generator().manual_seed(10_000 + seed)  # same stream for both losses
    curve = [expected_reward(theta.detach(), target)]
    clipped, weights, capped = [], [], []
    for step in range(steps):
        behav = history[max(0, step - staleness)]  # the sampler is `staleness` versions old
        ctx = torch.randint(contexts, (tasks_per_step,), generator=sample_gen)
        ctx = ctx.repeat_interleave(group_size)  # [B]
        logp_b_all = torch.log_softmax(behav[ctx], dim=-1)  # [B, T, V]
        tokens = torch.multinomial(
            logp_b_all.exp().reshape(-1, vocab), 1, generator=sample_gen
        ).reshape(len(ctx), length)  # [B, T]
        behavior_logprobs = logp_b_all.gather(-1, tokens[..., None])[..., 0]  # [B, T]
        rewards = (tokens == target[ctx]).float().mean(dim=1)  # [B]
        mask = torch.ones_like(behavior_logprobs)
        adv, _ = compute_advantages(cfg, rewards, mask, ctx.tolist())
        proximal = None
        if get_loss(cfg.loss).needs_recompute(updates):  # decoupled: the step-start weights
            with torch.no_grad():
                proximal = torch.log_softmax(theta[ctx], -1).gather(-1, tokens[..., None])[..., 0]
        for _ in range(updates):
            logp = torch.log_softmax(theta[ctx], -1).gather(-1, tokens[..., None])[..., 0]
            value, metrics = compute_policy_loss(cfg, logp, proximal, behavior_logprobs, adv, mask)
            opt.zero_grad()
            value.backward()
            opt.step()
            clipped.append(float(metrics["clip/frac"]))
            weights.append(float(metrics["behavior/weight/mean"]))
            capped.append(float(metrics.get("behavior/capped_frac", 0.0)))
        history.append(theta.detach().clone())
        curve.append(expected_reward(theta.detach(), target))
    return {
        "curve": [round(x, 4) for x in curve],
        "final": round(curve[-1], 4),
        "mean": round(statistics.fmean(curve[1:]), 4),  # area under the curve, per step
        "clip_frac_mean": round(statistics.fmean(clipped), 4),
        "behavior_weight_mean": round(statistics.fmean(weights), 4),
        "capped_frac_mean": round(statistics.fmean(capped), 4),  # masked or truncated tokens
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--staleness", default="0,4,8")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--updates", default="1,4", help="optimizer updates per step")
    parser.add_argument("--contexts", type=int, default=16)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--variants", default=",".join(LOSSES), help="of: " + ",".join(VARIANTS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    variants = [x for x in args.variants.split(",") if x]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown --variants {unknown}: choose from {sorted(VARIANTS)}")
    levels = [int(x) for x in args.staleness.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    ups = [int(x) for x in args.updates.split(",")]
    torch.set_num_threads(1)
    result: dict[str, Any] = {"benchmark": "decoupled_vs_naive", "machine": machine_info()}
    result["args"] = vars(args)
    rows = []
    print(
        f"{'updates':>7s} {'stale':>5s} {'loss':>26s} {'final reward':>12s} {'mean reward':>11s}"
        f" {'clip frac':>9s} {'w_behav':>8s} {'capped':>7s}"
    )
    for u in ups:
        for s in levels:
            for loss in variants:
                runs = [
                    train(loss, s, seed, steps=args.steps, contexts=args.contexts,
                          length=args.length, vocab=args.vocab, updates=u, lr=args.lr)
                    for seed in seeds
                ]  # fmt: skip
                row = {
                    "updates_per_step": u,
                    "staleness": s,
                    "loss": loss,
                    "seeds": seeds,
                    "final_mean": round(statistics.fmean(r["final"] for r in runs), 4),
                    "final_per_seed": [r["final"] for r in runs],
                    "reward_mean_over_steps": round(statistics.fmean(r["mean"] for r in runs), 4),
                    "clip_frac_mean": round(statistics.fmean(r["clip_frac_mean"] for r in runs), 4),
                    "behavior_weight_mean": round(
                        statistics.fmean(r["behavior_weight_mean"] for r in runs), 4
                    ),
                    "capped_frac_mean": round(
                        statistics.fmean(r["capped_frac_mean"] for r in runs), 4
                    ),
                    "curve_seed0": runs[0]["curve"],
                }
                rows.append(row)
                print(
                    f"{u:7d} {s:5d} {loss:>26s} {row['final_mean']:12.3f}"
                    f" {row['reward_mean_over_steps']:11.3f} {row['clip_frac_mean']:9.3f}"
                    f" {row['behavior_weight_mean']:8.3f} {row['capped_frac_mean']:7.3f}"
                )
    result["rows"] = rows
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
