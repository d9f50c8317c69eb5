"""``model.compute_dtype``: bf16 compute under autocast, float32 weights, gradients and head."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from areal_agents.config import load_config
from areal_agents.trainers.batching import collate
from areal_agents.trainers.config import ModelConfig, TrainConfig
from areal_agents.trainers.forward import critic_values, token_logprobs
from areal_agents.trainers.learner import Learner
from areal_agents.trainers.modeling import ValueModel, load_policy, tiny_model_path
from areal_agents.trainers.precision import mixed_precision
from tests.trainers._tiny_learner import batch, learner, params
from tests.trainers._tiny_learner import process_group as process_group  # autouse fixture

CPU = torch.device("cpu")


def _rows() -> Any:
    return collate(batch(), pad_id=0)


def _logprobs(model: Any, share: bool) -> torch.Tensor:
    return token_logprobs(model, _rows(), 1.0, device=CPU, share=share).logprobs


@pytest.mark.parametrize("share", [False, True])
def test_bf16_compute_changes_the_logprobs_a_little_and_keeps_them_float32(share: bool) -> None:
    full = load_policy(tiny_model_path())
    mixed = mixed_precision(load_policy(tiny_model_path()), "bfloat16", "cpu")
    a, b = _logprobs(full, share), _logprobs(mixed, share)
    on = _rows().loss_mask > 0
    diff = (a - b).detach()[on].abs()
    assert b.dtype == torch.float32
    assert float(diff.max()) > 0  # the body really ran in bf16
    assert float(diff.mean()) < 0.05  # and only rounding moved the log-probs
    assert not torch.is_autocast_enabled("cpu")  # the context ends with the call


def test_the_output_head_sees_float32_and_the_gradients_stay_float32() -> None:
    model = mixed_precision(load_policy(tiny_model_path()), "bfloat16", "cpu")
    seen: list[torch.dtype] = []
    inner: list[torch.dtype] = []
    model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda m, i, o: inner.append(o.dtype)
    )
    _logprobs(model, share=False).sum().backward()
    assert seen == [torch.float32] and inner == [torch.bfloat16]
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.float32}


def test_the_critic_head_runs_in_float32_too() -> None:
    critic = mixed_precision(ValueModel(tiny_model_path()), "bfloat16", "cpu")
    seen: list[torch.dtype] = []
    critic.head.register_forward_hook(lambda m, i, o: seen.append(i[0].dtype))
    values = critic_values(critic, _rows(), device=CPU, share=False)
    assert values.dtype == torch.float32 and seen == [torch.float32]


def test_float32_leaves_the_model_as_it_was_and_a_bad_name_is_refused() -> None:
    model = load_policy(tiny_model_path())
    forward = model.forward
    assert mixed_precision(model, "float32", "cpu").forward == forward
    with pytest.raises(ValueError, match="compute_dtype='float16'"):
        mixed_precision(model, "float16", "cpu")


def _learner(compute_dtype: str) -> Learner:
    return learner(model=ModelConfig(name="tiny", compute_dtype=compute_dtype))  # type: ignore[arg-type]


def test_the_config_key_reaches_the_learner_and_changes_its_step() -> None:
    cfg = load_config(TrainConfig, ["model=tiny", "model.compute_dtype=bfloat16"])
    assert cfg.model.compute_dtype == "bfloat16"
    full, mixed = _learner("float32"), _learner("bfloat16")
    before = params(mixed)
    a, b = full.train_step(batch(offset=-0.1)), mixed.train_step(batch(offset=-0.1))
    assert all(math.isfinite(v) for v in b.values())
    assert a["ratio/mean"] != b["ratio/mean"]  # the bf16 forward's log-probs differ
    assert b["ratio/mean"] == pytest.approx(a["ratio/mean"], rel=0.05)
    after = params(mixed)
    assert {v.dtype for v in after.values()} == {torch.float32}
    assert max(float((after[k] - before[k]).abs().max()) for k in before) > 0
