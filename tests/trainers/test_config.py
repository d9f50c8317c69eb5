"""Validation of the trainer's configuration keys (the keys themselves are used elsewhere)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from areal_agents.config import load_config
from areal_agents.errors import ConfigError
from areal_agents.trainers.config import TrainConfig, TrainerConfig


def test_batch_order_defaults_to_ready_and_is_checked() -> None:
    assert TrainerConfig().batch_order == "ready"
    cfg = load_config(TrainConfig, ["trainer.batch_order=admission"])
    assert cfg.trainer.batch_order == "admission"
    with pytest.raises(ConfigError, match="batch_order"):
        load_config(TrainConfig, ["trainer.batch_order=newest"])
    with pytest.raises(ConfigError, match="batch_order"):
        TrainerConfig(batch_order="newest")  # type: ignore[arg-type]


def test_torch_threads_are_optional_and_at_least_one() -> None:
    cfg = load_config(TrainConfig, ["trainer.torch_threads=1", "inference.torch_threads=2"])
    assert (cfg.trainer.torch_threads, cfg.inference.torch_threads) == (1, 2)
    assert TrainerConfig().torch_threads is None
    # the main command's recipe: one thread per process on a small shared machine
    assert TrainConfig().trainer.torch_threads == 1
    assert TrainConfig().inference.torch_threads == 1
    with pytest.raises(ConfigError, match=r"trainer\.torch_threads=0"):
        load_config(TrainConfig, ["trainer.torch_threads=0"])
    with pytest.raises(ConfigError, match=r"inference\.torch_threads=-1"):
        load_config(TrainConfig, ["inference.torch_threads=-1"])


def test_time_budget_is_optional_and_positive() -> None:
    assert TrainerConfig().time_budget_s is None
    assert load_config(TrainConfig, ["trainer.time_budget_s=90"]).trainer.time_budget_s == 90.0
    for bad in ("0", "-5"):
        with pytest.raises(ConfigError, match=r"trainer\.time_budget_s"):
            load_config(TrainConfig, [f"trainer.time_budget_s={bad}"])


def _numeric_keys() -> list[tuple[str, str, type]]:
    """(section, key, type) of every number of every section of TrainConfig, algo included."""
    root = TrainConfig()
    out = []
    for section in dataclasses.fields(root):
        value = getattr(root, section.name)
        if not dataclasses.is_dataclass(value):
            continue
        hints = typing.get_type_hints(type(value))
        for f in dataclasses.fields(value):
            kinds = {hints[f.name], *typing.get_args(hints[f.name])}
            number = next((k for k in (float, int) if k in kinds), None)
            if number is not None:
                out.append((section.name, f.name, number))
    return out


NUMERIC = _numeric_keys()


def test_every_numeric_key_is_covered() -> None:
    keys = {f"{s}.{k}" for s, k, _ in NUMERIC}
    assert {"trainer.lr", "trainer.rollout_workers", "inference.temperature"} <= keys
    assert {"inference.request_timeout_s", "algo.clip_eps_high", "ray.actor_cpus"} <= keys
    assert len(keys) > 40


@pytest.mark.parametrize(
    ("section", "key", "kind"), NUMERIC, ids=[f"{s}.{k}" for s, k, _ in NUMERIC]
)
def test_every_numeric_key_refuses_nan_inf_and_negatives(
    section: str, key: str, kind: type
) -> None:
    bad = ["-1"] + (["nan", "inf", "-inf"] if kind is float else [])
    for value in bad:
        with pytest.raises(ConfigError, match=rf"{section}\.{key}") as e:
            load_config(TrainConfig, [f"{section}.{key}={value}"])
        assert "Traceback" not in str(e.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.rollout_workers=0", r"trainer\.rollout_workers=0: must be at least 1"),
        ("trainer.learner_ranks=0", r"trainer\.learner_ranks=0: must be at least 1"),
        ("trainer.max_concurrent_groups=0", r"trainer\.max_concurrent_groups=0"),
        ("inference.temperature=nan", r"inference\.temperature=nan: must be a finite number"),
        ("inference.request_timeout_s=-1", r"inference\.request_timeout_s=-1\.0: a duration"),
        ("inference.startup_timeout_s=0", r"inference\.startup_timeout_s=0\.0: a duration"),
        ("inference.weight_sync_timeout_s=0", r"inference\.weight_sync_timeout_s"),
        ("trainer.seed=-1", r"trainer\.seed=-1: must not be negative"),
        ("algo.clip_eps_high=nan", r"algo\.clip_eps_high=nan"),
    ],
)
def test_reported_bad_values_are_refused_with_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, [override])


def test_optional_counts_stay_optional() -> None:
    cfg = load_config(TrainConfig, ["trainer.max_concurrent_groups=null", "env.max_turns=null"])
    assert cfg.trainer.max_concurrent_groups is None and cfg.env.max_turns is None


def test_an_object_store_ray_would_refuse_is_refused_here() -> None:
    with pytest.raises(ConfigError, match=r"ray\.object_store_mb=64: at least 75"):
        load_config(TrainConfig, ["ray.object_store_mb=64"])
    assert load_config(TrainConfig, ["ray.object_store_mb=75"]).ray.object_store_mb == 75


def test_dr_grpo_divides_by_a_constant_the_config_resolves() -> None:
    """Dr. GRPO's ``seq_sum_norm`` needs one length for every batch: the most policy tokens an
    episode holds (``inference.max_tokens`` x ``env.max_turns``) unless ``algo.norm_tokens``
    says otherwise; an environment of unknown turns must name it."""
    cfg = load_config(TrainConfig, ["algo=dr_grpo", "env=calculator", "inference.max_tokens=40"])
    assert cfg.env.max_turns is not None
    assert cfg.algo.norm_tokens == 40 * cfg.env.max_turns
    kept = load_config(TrainConfig, ["algo=dr_grpo", "env=calculator", "algo.norm_tokens=7"])
    assert kept.algo.norm_tokens == 7
    with pytest.raises(ConfigError, match=r"algo\.norm_tokens"):
        TrainConfig(
            env=dataclasses.replace(TrainConfig().env, max_turns=None),
            algo=TrainConfig().algo.replace(aggregation="seq_sum_norm"),
        )
