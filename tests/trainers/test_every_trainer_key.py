"""Every non-default ``trainer.*`` value has its effect: the learner's keys through
:meth:`Learner.train_step` on the tiny model (one rank in this process, gloo), the loop's where
they act (the buffer the loop builds, the checkpoint rule, the rollout workers it starts).
``tests/trainers/test_every_key.py``'s ``COVERED`` table names these tests; the ``algo.*`` keys
are checked there."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.trainers.config import TrainConfig, TrainerConfig
from tests.trainers._tiny_learner import (
    algo,
    batch,
    fresh_batch,
    grad_norm_left,
    largest_change,
    learner,
    params,
    process_group,  # noqa: F401  (the autouse fixture)
    row,
    step,
)

# ---- trainer.*: the learner ------------------------------------------------------------------


def test_lr_warmup_and_schedules() -> None:
    for lr, warmup, first_change in ((1e-3, 0, 1e-3), (1e-6, 0, 1e-6), (1e-3, 4, 1e-3 / 4)):
        lrn = learner(lr=lr, warmup_steps=warmup)
        before = params(lrn)
        lrn.train_step(batch())  # Adam's first step moves a parameter by about lr * factor
        assert largest_change(before, params(lrn)) == pytest.approx(first_change, rel=0.05)
    # "lr" is what the step's updates used: the warm-up's first two steps, then a schedule's
    # second step (its first is always the configured lr)
    assert lrs(2, warmup_steps=4) == pytest.approx([1e-3 / 4, 1e-3 * 2 / 4])
    assert lrs(2, lr_schedule="linear", total_steps=4)[1] == pytest.approx(1e-3 * 0.75)
    cosine = lrs(2, lr_schedule="cosine", total_steps=4)[1]
    assert cosine == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lrs(2) == [1e-3, 1e-3]  # constant


def lrs(steps: int, **trainer: Any) -> list[float]:
    """The "lr" metric of ``steps`` train steps of a fresh learner."""
    lrn = learner(**trainer)
    return [lrn.train_step(batch(offset=-0.1 * i))["lr"] for i in range(steps)]


def test_probe_tokens_measure_the_update_and_target_kl_brakes_the_lr() -> None:
    off = step(probe_tokens=0)
    assert "policy/update_kl" not in off
    on = learner()  # the default probe: the first batch's policy tokens (4 rows x 8 here)
    first = on.train_step(batch())
    assert first["policy/update_kl"] > 0 and first["learner/lr_scale"] == 1.0
    assert on.probe.rows is not None and sum(len(p) for _, p in on.probe.rows) == 32
    # a target far below what a step at lr 1e-3 moves: the next step's lr halves, then again
    braked = learner(target_kl=first["policy/update_kl"] / 100)
    m1 = braked.train_step(batch())
    m2 = braked.train_step(fresh_batch(braked))  # on-policy again: a real gradient each step
    m3 = braked.train_step(fresh_batch(braked))
    assert (m1["lr"], m2["lr"], m3["lr"]) == pytest.approx((1e-3, 5e-4, 2.5e-4))
    assert all(m["clip/frac"] == 0 and m["grad_norm"] > 1 for m in (m2, m3))
    target = (
        first["policy/update_kl"] / 100
    )  # the next scale: 0.25 x sqrt(target / kl), in [/2, x2]
    factor = min(2.0, max(0.5, math.sqrt(target / m3["policy/update_kl"])))
    assert m3["learner/lr_scale"] == pytest.approx(0.25 * factor)
    free = learner(target_kl=1e6)  # a target never reached: the configured lr throughout
    assert [free.train_step(batch())["lr"] for _ in range(2)] == [1e-3, 1e-3]
    with pytest.raises(Exception, match="probe_tokens"):
        TrainerConfig(target_kl=0.01, probe_tokens=0)


def test_weight_decay_and_betas() -> None:
    decays_each_weight_by_lr_times_weight_decay(lr=0.1)
    odd = learner(betas=(0.5, 0.6))
    assert odd.optimizer.param_groups[0]["betas"] == (0.5, 0.6)
    usual = learner()
    for lrn in (odd, usual):  # Adam's first step is independent of the betas; the second not
        lrn.train_step(batch())
        assert lrn.train_step(fresh_batch(lrn))["clip/frac"] == 0
    assert largest_change(params(odd), params(usual)) > 1e-5


def decays_each_weight_by_lr_times_weight_decay(**trainer: Any) -> None:
    """A step with weight decay 0.5 leaves each weight lr x 0.5 x itself nearer 0 than the same
    step without (decoupled decay: the same update from the same gradient, then the shrink); a
    step with no data moves nothing, not even by the decay."""
    decayed, plain = learner(weight_decay=0.5, **trainer), learner(**trainer)
    before = params(decayed)
    empty = [dataclasses.replace(t, loss_mask=(0,) * len(t.loss_mask)) for t in batch()]
    decayed.train_step(empty)
    assert all(torch.equal(params(decayed)[k], before[k]) for k in before)
    for lrn in (decayed, plain):
        lrn.train_step(batch())
    shrink = trainer["lr"] * 0.5
    a, b = params(decayed), params(plain)
    assert all(torch.allclose(a[k], b[k] - shrink * before[k], atol=1e-6) for k in before)


def test_optimizer_sgd_moves_each_weight_by_its_gradient() -> None:
    # AdamW's first step moves every weight with a gradient by about lr; SGD by lr x gradient
    adam, sgd = learner(max_grad_norm=0), learner(optimizer="sgd", lr=0.1, max_grad_norm=0)
    start = params(sgd)
    for lrn in (adam, sgd):
        lrn.train_step(batch())
    grads = {n: p.grad for n, p in sgd.model.named_parameters() if p.grad is not None}
    moved = {k: params(sgd)[k] - start[k] for k in start}
    for name, grad in grads.items():
        full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        assert torch.allclose(moved[name], -0.1 * full, atol=1e-7), name
    assert largest_change(start, params(adam)) == pytest.approx(1e-3, rel=0.05)
    # momentum: the second step adds momentum x the first step's gradient (both learners are
    # at the same weights after the first step, so their second batches and gradients agree)
    heavy, plain = (
        learner(optimizer="sgd", lr=0.1, sgd_momentum=0.9),
        learner(optimizer="sgd", lr=0.1),
    )
    for lrn in (heavy, plain):
        lrn.train_step(batch())
    first = gradients(heavy)  # after clipping, as the update used it
    for lrn in (heavy, plain):
        assert lrn.train_step(fresh_batch(lrn))["grad_norm"] > 1
    a, b = params(heavy), params(plain)
    assert all(torch.allclose(a[k] - b[k], -0.1 * 0.9 * first[k], atol=1e-6) for k in first)
    decays_each_weight_by_lr_times_weight_decay(optimizer="sgd", lr=0.1)
    with pytest.raises(Exception, match=r"trainer\.optimizer"):
        TrainerConfig(optimizer="lion")  # type: ignore[arg-type]


def test_max_grad_norm_clips_the_update() -> None:
    clipped = learner(max_grad_norm=1e-6)  # the probe's forward after it leaves them too
    metrics = clipped.train_step(batch())
    assert metrics["grad_norm"] > 1e-5  # reported before clipping...
    assert grad_norm_left(clipped) == pytest.approx(1e-6, rel=1e-2)  # ...applied after it
    free = learner(max_grad_norm=0)
    metrics = free.train_step(batch())
    assert grad_norm_left(free) == pytest.approx(metrics["grad_norm"], rel=1e-4)


def test_micro_batch_tokens_split_the_work_not_the_update() -> None:
    calls = []
    # probe_tokens=0: only the update's forward passes are counted (the probe's are its own)
    small, large = learner(micro_batch_tokens=16, probe_tokens=0), learner(probe_tokens=0)
    small.model.register_forward_hook(lambda *a: calls.append(1))
    m_small, m_large = small.train_step(batch()), large.train_step(batch())
    assert len(calls) == 4  # 14-token rows: one row per 16-token micro-batch
    assert m_small["loss/policy"] == pytest.approx(m_large["loss/policy"], abs=1e-6)
    assert m_small["grad_norm"] == pytest.approx(m_large["grad_norm"], rel=1e-5)
    assert grad_norm_left(small) == pytest.approx(grad_norm_left(large), rel=1e-5)


def test_share_prompt_prefix_runs_the_shared_prefix_once_and_changes_nothing_else() -> None:
    data = batch(offset=-0.1, prefix=tuple(range(100, 124)))  # 24 shared tokens, then 14 own
    two = algo(loss="decoupled_ppo", kl_coef=0.1)  # 2 epochs: a proximal pass; a reference
    for cfg, kw in ((two, {"ppo_epochs": 2}), ("ppo", {})):  # ppo: the critic's passes too
        on, off = learner(cfg, **kw), learner(cfg, share_prompt_prefix=False, **kw)
        m_on, m_off = on.train_step(data), off.train_step(data)
        # one micro-batch of the 4 rows of 38 tokens (per update): padded 4 x 38, packed the
        # prefix once and each row's 13 tokens after it, less the last (it predicts nothing)
        assert m_off.pop("learner/forward_tokens") == 4 * 38
        assert m_on.pop("learner/forward_tokens") == 24 + 4 * 13
        assert m_on.keys() == m_off.keys()
        for key, value in m_off.items():
            assert m_on[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        # the last update's gradients, parameter by parameter (Adam's steps would magnify
        # float32 noise on the near-zero ones)
        g_on, g_off = gradients(on), gradients(off)
        assert g_on.keys() == g_off.keys() and g_off
        assert all((g_on[k] - g_off[k]).norm() <= 1e-4 * g_off[k].norm() for k in g_off)


def gradients(lrn: Any) -> dict[str, torch.Tensor]:
    models = [("", lrn.model), ("critic.", lrn.critic)]
    return {
        prefix + name: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        for prefix, model in models
        if model is not None
        for name, p in model.named_parameters()
        if p.grad is not None
    }


def test_ppo_epochs_and_minibatches_are_optimizer_updates() -> None:
    for kw, updates in (({"ppo_epochs": 2}, 2), ({"minibatches": 2}, 2), ({}, 1)):
        lrn = learner(**kw)
        lrn.train_step(batch())
        state = lrn.optimizer.state_dict()["state"]
        assert {int(s["step"]) for s in state.values()} == {updates}, kw


def test_torch_threads_and_seed_reach_the_learner() -> None:
    lrn = learner(torch_threads=1, seed=7)
    assert torch.get_num_threads() == 1
    assert torch.initial_seed() == 7 and lrn.spec.trainer.seed == 7


# ---- trainer.* and algo.dynamic_sampling: the loop -------------------------------------------


def buffer_for(*overrides: str) -> TrajectoryBuffer:
    from areal_agents.config import load_config
    from areal_agents.trainers.loop import buffer_options

    pinned = [  # the counts below are worked out for these, whatever the defaults become
        "trainer.groups_per_step=2",
        "trainer.max_concurrent_groups=null",
    ]
    cfg = load_config(TrainConfig, ["env=calculator", "env.group_size=2", *pinned, *overrides])
    return TrajectoryBuffer(**buffer_options(cfg))


def test_mode_max_staleness_and_groups_per_step_bound_admission() -> None:
    assert len(buffer_for("trainer.mode=sync").admit(100)) == 2  # (0 + 1) * G
    assert len(buffer_for().admit(100)) == 6  # async default: (2 + 1) * G
    assert len(buffer_for("trainer.max_staleness=4", "trainer.total_steps=9").admit(100)) == 10
    assert len(buffer_for("trainer.groups_per_step=3", "trainer.mode=sync").admit(100)) == 3


def test_total_steps_caps_admission_at_the_groups_the_run_trains() -> None:
    # staleness 4 would allow (4 + 1) * 2 = 10 groups; the run trains 3 * 2 = 6
    buf = buffer_for("trainer.max_staleness=4", "trainer.total_steps=3")
    assert [r.index for r, _ in buf.admit(100)] == [0, 1, 2, 3, 4, 5]
    assert buf.admit(100) == []


def test_batch_order_seed_and_dynamic_sampling_reach_the_buffer() -> None:
    assert buffer_for("trainer.batch_order=admission").batch_order == "admission"
    seeds = [r.seed for r, _ in buffer_for().admit(3)]
    assert [r.seed for r, _ in buffer_for("trainer.seed=1").admit(3)] != seeds
    uniform = [row("a", 1.0), row("a", 1.0)]
    plain = buffer_for()
    assert plain.complete(plain.admit(1)[0][0].index, uniform) == "ready"
    buf = buffer_for("algo=dapo")  # dynamic sampling: a uniform group is dropped...
    admitted = buf.admit(100)
    assert len(admitted) == 6 and buf.admit(100) == []
    assert buf.complete(admitted[0][0].index, uniform) == "filtered"
    assert len(buf.admit(100)) == 1  # ...and another task takes its slot


def test_checkpoint_every_and_total_steps() -> None:
    from areal_agents.config import load_config
    from areal_agents.trainers.loop import checkpoint_due

    def due(*overrides: str) -> list[int]:
        cfg = load_config(TrainConfig, ["env=calculator", "trainer.total_steps=5", *overrides])
        return [s for s in range(1, 6) if checkpoint_due(s, cfg)]

    assert due() == [5]  # by default: by time (not reached here) and the last step
    assert due("trainer.checkpoint_every=1") == [1, 2, 3, 4, 5]
    assert due("trainer.checkpoint_every=2") == [2, 4, 5]
    assert due("trainer.checkpoint_every=0") == [5]  # the last step always


def test_checkpoint_interval_s_saves_by_time() -> None:
    from areal_agents.config import load_config
    from areal_agents.trainers.loop import checkpoint_due

    cfg = load_config(TrainConfig, ["env=calculator", "trainer.checkpoint_interval_s=30"])
    assert not checkpoint_due(1, cfg, since_last_s=29.0)
    assert checkpoint_due(1, cfg, since_last_s=30.0)
    off = load_config(TrainConfig, ["env=calculator", "trainer.checkpoint_interval_s=null"])
    assert not checkpoint_due(1, off, since_last_s=1e9)
    assert checkpoint_due(off.trainer.total_steps, off, since_last_s=0.0)


def test_rollout_workers_and_concurrent_groups_shape_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from areal_agents.config import load_config
    from areal_agents.trainers import loop, loop_helpers

    made: list[dict[str, Any]] = []

    class FakeActor:
        def options(self, **options: Any) -> FakeActor:
            return self

        def remote(self, **kwargs: Any) -> dict[str, Any]:
            made.append(kwargs)
            return kwargs

    monkeypatch.setattr(loop_helpers, "remote_class", lambda cls: FakeActor())
    cfg = load_config(
        TrainConfig,
        ["env=calculator", "trainer.rollout_workers=3", "trainer.max_concurrent_groups=5"],
    )
    server = type("S", (), {"base_url": "http://127.0.0.1:1/v1"})()
    loop.start_workers(cfg, [server], Path("m"), buffer=None)
    assert [w["worker_id"] for w in made] == [0, 1, 2]
    assert {w["max_concurrent_groups"] for w in made} == {5}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")
def test_learner_cpus_and_inference_cpus_place_the_learner_and_the_rollout_workers() -> None:
    from areal_agents.cpus import pin_process
    from areal_agents.trainers.config import EnvConfig, InferenceConfig
    from areal_agents.trainers.modeling import tiny_model_path
    from areal_agents.trainers.runtime import RolloutWorkerActor

    before = sorted(os.sched_getaffinity(0))
    first, last = before[0], before[-1]
    try:  # both are built in this process here: each moves the process it runs in
        learner(learner_cpus=(first,))
        assert os.sched_getaffinity(0) == {first}
        pin_process(before)
        learner()  # None: left where it is
        assert sorted(os.sched_getaffinity(0)) == before
        RolloutWorkerActor(
            env=EnvConfig(name="calculator"),
            inference=InferenceConfig(cpus=(last,)),
            base_urls=["http://127.0.0.1:9/v1"],
            model_dir=str(tiny_model_path()),
            served_name="policy",
            buffer=None,
            worker_id=0,
            max_concurrent_groups=1,
        )
        assert os.sched_getaffinity(0) == {last}
    finally:
        pin_process(before)
