"""trainers/forward.py: a micro-batch's shared prompt prefix runs once, and changes nothing.

The acceptance test is exactness: with the prefix packed, the log-probs and entropies at every
position the loss reads, and the parameter gradients after one backward of the real loss
(``compute_policy_loss``, GRPO's decoupled PPO with an entropy term), equal those of the
padded batch — on the tiny model here, on the default model in the ``slow`` test below, with
LoRA and gradient checkpointing, and for the critic. FSDP over 2 ranks is checked in
``test_fsdp_equivalence.py``; ``trainer.share_prompt_prefix`` end to end in
``test_every_trainer_key.py``.

Tolerances (float32): log-probs and entropies within ``1e-5`` absolute on the tiny model
(measured: under 1e-6 and 9e-6). The gradients: each parameter's relative difference
``|g_packed - g_padded| / |g_padded|`` (Frobenius norms) below ``1e-4`` (measured: under 1e-6
on the tiny model). The two computations sum the same terms in another order (different
matrix shapes, attention over another key length), which is all that differs.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from areal_agents.trainers.algorithms import AlgoConfig
from areal_agents.trainers.batching import Batch, collate, micro_batches
from areal_agents.trainers.config import LoraConfig
from areal_agents.trainers.forward import (
    MIN_SHARED_PREFIX,
    critic_values,
    forwarded_tokens,
    micro_batch_cost,
    pack,
    shared_prefix,
    token_logprobs,
)
from areal_agents.trainers.lora import apply_lora
from areal_agents.trainers.losses import compute_policy_loss
from areal_agents.trainers.modeling import ValueModel, load_policy, tiny_model_path
from areal_agents.types import Trajectory

CPU = torch.device("cpu")
ALGO = AlgoConfig.from_name("grpo").replace(loss="decoupled_ppo", entropy_coef=0.01)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def traj(ids: list[int], prompt: int, reward: float = 1.0, group: str = "g") -> Trajectory:
    """``ids`` whose first ``prompt`` tokens are the prompt (mask 0), the rest policy tokens."""
    mask = [0] * prompt + [1] * (len(ids) - prompt)
    return Trajectory(
        sequence_ids=tuple(ids),
        loss_mask=tuple(mask),
        behavior_logprobs=tuple(-3.0 * m for m in mask),
        versions=tuple(0 if m else -1 for m in mask),
        reward=reward,
        group_id=group,
    )


def rows_sharing(
    prefix: int, prompts: list[int], completions: list[int], seed: int = 0
) -> list[Trajectory]:
    """Rows that share ``prefix`` random tokens, then a prompt tail and a completion each."""
    rng = random.Random(seed)
    shared = [rng.randrange(5, 2000) for _ in range(prefix)]
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        own = [rng.randrange(5, 2000) for _ in range(p + c)]
        out.append(traj(shared + own, prefix + p, reward=float(i % 2), group=f"g{i // 2}"))
    return out


# ---- which prefix, and the packed layout ------------------------------------------------------


def test_the_shared_prefix_stops_at_the_first_policy_token_and_before_the_shortest_end() -> None:
    rows = rows_sharing(30, [0, 6], [5, 9])
    assert shared_prefix(collate(rows, 0)) == 30  # the first policy token of row 0
    early = [*rows, traj([*rows[0].sequence_ids[:25], 7, 8, 9], 25)]
    assert shared_prefix(collate(early, 0)) == 25
    same = [traj(list(range(100, 140)), 40)] * 2  # identical, no policy token
    assert shared_prefix(collate(same, 0)) == 39  # every row keeps a predicted position
    short = rows_sharing(MIN_SHARED_PREFIX - 1, [0, 0], [5, 5])
    assert shared_prefix(collate(short, 0)) == 0
    assert shared_prefix(collate(short, 0), minimum=4) == MIN_SHARED_PREFIX - 1
    assert shared_prefix(collate(rows[:1], 0)) == 0  # one row shares with nobody
    mb = collate(rows, 0)
    assert forwarded_tokens(mb, share=False) == 2 * (30 + 15)
    assert forwarded_tokens(mb, share=True) == 30 + (5 - 1) + (15 - 1)


def test_each_rest_sees_the_prefix_and_itself_causally_at_its_own_positions() -> None:
    rows = [traj([1, 2, 3, 4, 5], 3), traj([1, 2, 3, 6, 7, 8], 3)]
    packed = pack(collate(rows, 0), 3)
    # [1 2 3 | 4 | 6 7]: each row's last token predicts nothing and is left out
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 6, 7]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 3, 4]]
    allowed = (packed.attention_mask(torch.float32)[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],  # rest 0 sees the prefix and itself
        [1, 1, 1, 0, 1, 0],  # rest 1 never sees rest 0
        [1, 1, 1, 0, 1, 1],
    ]
    # kept: the prefix's last position once per row, then each rest
    assert packed.keep.tolist() == [2, 3, 2, 4, 5]
    assert packed.rows.tolist() == [0, 0, 1, 1, 1]
    assert packed.cols.tolist() == [2, 3, 2, 3, 4]
    assert packed.targets.tolist() == [4, 5, 6, 7, 8]
    with pytest.raises(ValueError, match="do not share"):
        pack(collate([traj([1, 2, 3, 4], 2), traj([1, 9, 3, 4], 2)], 0), 3)


def test_micro_batches_are_planned_by_the_tokens_forwarded() -> None:
    rows = rows_sharing(40, [3, 8, 1, 5, 2, 7], [6, 4, 9, 3, 8, 5])
    data = collate(rows, 0)
    everything = list(range(len(rows)))
    padded = micro_batches(everything, data.lengths, 120)
    packed = micro_batches(everything, data.lengths, 120, micro_batch_cost(data, True))
    assert [len(mb) for mb in padded] == [2, 2, 2]
    assert len(packed) < len(padded)
    assert all(forwarded_tokens(data.rows(mb), share=True) <= 120 for mb in packed)
    assert micro_batch_cost(data, False) is None  # the padded size: plan's default


# ---- exactness --------------------------------------------------------------------------------


def loss_and_grads(
    model: Any, mb: Batch, share: bool, temperature: float = 0.7
) -> tuple[Any, dict[str, torch.Tensor]]:
    """One forward and one backward of the real loss; the forward's output and the grads."""
    model.zero_grad(set_to_none=True)
    out = token_logprobs(model, mb, temperature, device=CPU, share=share, entropy=True)
    adv = torch.linspace(-1.0, 1.0, mb.loss_mask.shape[0])[:, None].expand_as(mb.loss_mask)
    loss, _ = compute_policy_loss(
        ALGO,
        out.logprobs,
        None,
        mb.behavior_logprobs,
        adv.contiguous(),
        mb.loss_mask,
        entropy=out.entropy,
        normalizer=float(mb.loss_mask.sum()),
    )
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def exactness(
    packed: Any, padded: Any, g_packed: dict[str, Any], g_padded: dict[str, Any], on: Any
) -> dict[str, float]:
    """The differences on the mask: log-probs (largest, mean), entropies (largest, and
    relative to the entropy), and the gradients (the largest per-parameter relative difference
    and that of all parameters together)."""
    assert set(g_packed) == set(g_padded) and g_padded
    lp = (packed.logprobs - padded.logprobs).detach()[on].abs()
    ent = (packed.entropy - padded.entropy).detach()[on].abs()
    diff = sum(float((g_packed[k] - g_padded[k]).norm() ** 2) for k in g_padded)
    total = sum(float(g_padded[k].norm() ** 2) for k in g_padded)
    return {
        "logprobs": float(lp.max()),
        "logprobs_mean": float(lp.mean()),
        "entropy": float(ent.max()),
        "entropy_rel": float((ent / padded.entropy.detach()[on].abs().clamp(min=1.0)).max()),
        "grad_rel": max(
            float((g_packed[k] - g_padded[k]).norm() / g_padded[k].norm()) for k in g_padded
        ),
        "grad_rel_all": (diff / total) ** 0.5,
    }


def assert_same(model: Any, mb: Batch, lp_tol: float = 1e-5, grad_rtol: float = 1e-4) -> Any:
    """Packed and padded give the same log-probs, entropies and grads; returns the packed.

    Entropies (about 11 nats on the random tiny model) within ``lp_tol`` or ``2e-6``
    relative, whichever is larger (float32 resolves 1e-6 of 11 nats).
    """
    padded, g_padded = loss_and_grads(model, mb, share=False)
    packed, g_packed = loss_and_grads(model, mb, share=True)
    on = mb.loss_mask.bool()
    assert packed.tokens < padded.tokens == mb.sequence_ids.numel()
    errors = exactness(packed, padded, g_packed, g_padded, on)
    assert errors["logprobs"] < lp_tol, errors
    assert errors["entropy"] < lp_tol or errors["entropy_rel"] < 2e-6, errors
    assert errors["grad_rel"] < grad_rtol, errors
    # before the prefix's last position nothing was computed: 0, and off the mask
    p = shared_prefix(mb)
    assert not on[:, : p - 1].any()
    assert packed.logprobs[:, : p - 1].abs().sum() == 0
    assert packed.entropy[:, : p - 1].abs().sum() == 0
    return packed


@pytest.fixture(scope="module")
def tiny() -> Any:
    return load_policy(tiny_model_path())


@pytest.mark.parametrize(
    ("prefix", "prompts", "completions"),
    [
        (24, [0, 5, 17, 3], [4, 30, 9, 60]),  # prompt tails and completions of several lengths
        (64, [0, 90, 2], [1, 3, 120]),  # very different lengths: 65 to 186 tokens
        (16, [0, 0], [1, 1]),  # the shortest: one policy token right after the prefix
    ],
)
def test_packing_gives_the_padded_batch_log_probs_entropies_and_gradients(
    tiny: Any, prefix: int, prompts: list[int], completions: list[int]
) -> None:
    mb = collate(rows_sharing(prefix, prompts, completions), 0)
    assert shared_prefix(mb) == prefix
    assert_same(tiny, mb)


def test_rows_that_share_nothing_run_the_padded_batch(tiny: Any) -> None:
    mb = collate(rows_sharing(0, [10, 3, 20], [5, 9, 2], seed=3), 0)
    assert shared_prefix(mb) == 0
    padded, g_padded = loss_and_grads(tiny, mb, share=False)
    same, g_same = loss_and_grads(tiny, mb, share=True)
    assert same.tokens == padded.tokens == mb.sequence_ids.numel()
    assert torch.equal(same.logprobs, padded.logprobs) and torch.equal(same.entropy, padded.entropy)
    assert all(torch.equal(g_same[k], g_padded[k]) for k in g_padded)


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_lora_and_gradient_checkpointing_pack_exactly(gradient_checkpointing: bool) -> None:
    model = load_policy(tiny_model_path(), gradient_checkpointing=gradient_checkpointing)
    apply_lora(model, LoraConfig(r=4, alpha=8.0))
    for name, param in model.named_parameters():  # lora_B starts at 0: give it a gradient path
        if ".lora_B." in name:
            torch.nn.init.normal_(param, std=0.02, generator=torch.Generator().manual_seed(1))
    mb = collate(rows_sharing(24, [0, 5, 17], [4, 30, 9]), 0)
    assert_same(model, mb)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)


def test_the_critic_packs_exactly() -> None:
    critic = ValueModel(tiny_model_path())
    torch.nn.init.normal_(critic.head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
    mb = collate(rows_sharing(24, [0, 5, 17], [4, 30, 9]), 0)
    on = mb.loss_mask.bool()
    results = []
    for share in (False, True):
        critic.zero_grad(set_to_none=True)
        values = critic_values(critic, mb, device=CPU, share=share)
        assert values.shape == mb.loss_mask.shape
        ((values - 0.5) ** 2 * mb.loss_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}
        results.append((values.detach(), grads))
    (v_padded, g_padded), (v_packed, g_packed) = results
    assert float((v_packed - v_padded)[on].abs().max()) < 1e-5
    worst = max(float((g_packed[k] - g_padded[k]).norm() / g_padded[k].norm()) for k in g_padded)
    assert worst < 1e-4


# ---- the default model, on real code-environment prompts ------------------------------------


def code_rows(model_dir: Any, count: int) -> list[Trajectory]:
    """``count`` code-environment episodes as the learner gets them: the rendered prompt
    (system prompt, tool schemas, the task) and a fenced solution closing the turn."""
    from transformers import AutoTokenizer

    from areal_agents.envs.code_sandbox import CodeSandboxEnv
    from areal_agents.envs.tasks.code import ProceduralCodeTasks
    from areal_agents.policies.templates import render_prompt_ids

    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
    env = CodeSandboxEnv(sandbox_backend="process")
    tasks = ProceduralCodeTasks()
    out = []
    try:
        for i in range(count):
            obs, info = env.reset(seed=i)
            prompt = render_prompt_ids(tokenizer, obs, info["tools"])
            solution = tasks.get(info["task_id"]).metadata["canonical_solution"]
            reply = f"Here you go.{' Checked.' * (3 * i)}\n```python\n{solution}```<|im_end|>"
            completion = tokenizer.encode(reply, add_special_tokens=False)
            out.append(traj(prompt + completion, len(prompt), float(i % 2), f"g{i // 2}"))
    finally:
        env.close()
    return out


@pytest.mark.slow
def test_the_default_model_packs_exactly_on_code_prompts() -> None:
    """SmolLM2-135M's 30 layers in float32: the padded batch itself is only reproducible to
    about 3e-5 in a log-prob (against float64: largest 2.5e-5, measured on these rows; one row
    alone against the same row in a batch: 2e-5), so the bound is 1e-4 (measured 3.4e-5; mean
    3.5e-6), and 1e-3 per parameter's gradient (measured 1e-4; all together 2e-5). In
    float64 the log-probs came out identical and the gradients within 3e-7 (the model's
    RMSNorm computes in float32 even then)."""
    from areal_agents.trainers.modeling import resolve_model_dir

    model_dir = resolve_model_dir("default")
    mb = collate(code_rows(model_dir, 3), 0)
    assert shared_prefix(mb) > 300  # the system prompt and the tool schemas
    packed = assert_same(load_policy(model_dir), mb, lp_tol=1e-4, grad_rtol=1e-3)
    assert packed.tokens < 0.6 * mb.sequence_ids.numel()
