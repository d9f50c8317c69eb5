"""Validation of the trainer's configuration keys (the keys themselves are used elsewhere)."""

from __future__ import annotations

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
    assert TrainConfig().trainer.torch_threads is None
    assert TrainConfig().inference.torch_threads is None
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
