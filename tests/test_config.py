"""Typed configs composed by Hydra: conversion, groups, validation, helpful errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from areal_agents.config import check_numbers, dump_yaml, load_config, to_dict, writable_dir
from areal_agents.errors import ConfigError


@dataclass
class Algo:
    name: str = "ppo"
    clip: float = 0.2
    critic: bool = True

    @classmethod
    def from_name(cls, name: str) -> Algo:
        presets = {"ppo": cls(), "grpo": cls(name="grpo", critic=False)}
        if name not in presets:
            raise ConfigError(f"algo={name!r}: choose one of {sorted(presets)}")
        return presets[name]


@dataclass
class Trainer:
    mode: Literal["sync", "async"] = "async"
    max_staleness: int = 2
    tags: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ConfigError(f"trainer.max_staleness={self.max_staleness}: must be >= 0")


@dataclass
class Root:
    output_dir: str = "runs/x"
    algo: Algo = field(default_factory=Algo)
    trainer: Trainer = field(default_factory=Trainer)


def test_defaults_and_typed_overrides() -> None:
    cfg = load_config(Root, ["trainer.max_staleness=4", "trainer.mode=sync", "trainer.tags=[a,b]"])
    assert cfg.trainer == Trainer(mode="sync", max_staleness=4, tags=("a", "b"))
    assert cfg.algo == Algo()
    assert load_config(Root, ["trainer.seed=null"]).trainer.seed is None
    assert load_config(Root, ["trainer.seed=7"]).trainer.seed == 7


def test_group_selection_applies_before_field_overrides_whatever_the_order() -> None:
    cfg = load_config(Root, ["algo.clip=0.3", "algo=grpo"])
    assert cfg.algo == Algo(name="grpo", clip=0.3, critic=False)


def test_unknown_keys_suggest_the_right_one() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.max_stalenes.*did you mean 'max_staleness'"):
        load_config(Root, ["trainer.max_stalenes=4"])
    with pytest.raises(ConfigError, match="did you mean 'trainer'"):
        load_config(Root, ["trainr.mode=sync"])


def test_bad_values_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.max_staleness: expected an integer"):
        load_config(Root, ["trainer.max_staleness=lots"])
    with pytest.raises(ConfigError, match=r"trainer\.mode='asynch' is not allowed.*did you mean"):
        load_config(Root, ["trainer.mode=asynch"])
    with pytest.raises(ConfigError, match="must be >= 0"):
        load_config(Root, ["trainer.max_staleness=-1"])
    with pytest.raises(ConfigError, match="choose one of"):
        load_config(Root, ["algo=sac"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(Root, ["trainer.mode"])
    with pytest.raises(ConfigError, match="is a section"):
        load_config(Root, ["trainer=fast"])


def test_config_file_then_overrides_and_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"algo": "grpo", "trainer": {"max_staleness": 8}}))
    cfg = load_config(Root, [f"config={path}", "trainer.max_staleness=1"])
    assert cfg.algo.name == "grpo" and cfg.trainer.max_staleness == 1
    out = tmp_path / "run" / "config.yaml"
    dump_yaml(cfg, out)
    assert yaml.safe_load(out.read_text()) == to_dict(cfg)
    assert load_config(Root, [f"config={out}"]) == cfg
    with pytest.raises(ConfigError, match="no such file"):
        load_config(Root, [f"config={tmp_path / 'missing.yaml'}"])


@dataclass
class Numbers:
    rate: float = 0.5
    count: int = 3
    offset: float = 0.0
    timeout_s: float = 1.0
    delay_s: float = 0.5
    pair: tuple[float, ...] = (0.1, 0.2)
    limit: int | None = None
    on: bool = False

    def __post_init__(self) -> None:
        check_numbers(self, "num", signed={"offset"}, zero_ok={"delay_s"})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rate=nan", r"num\.rate=nan: must be a finite number"),
        ("rate=.inf", r"num\.rate=inf: must be a finite number"),
        ("rate=-1e999", r"num\.rate=-inf"),
        ("count=-1", r"num\.count=-1: must not be negative"),
        ("pair=[0.1,nan]", r"num\.pair=\[0\.1, nan\]: must be a finite"),
        ("pair=[-1,2]", r"num\.pair=\[-1\.0, 2\.0\]: must not be negative"),
        ("limit=-3", r"num\.limit=-3"),
        ("timeout_s=0", r"num\.timeout_s=0\.0: a duration must be positive"),
        ("timeout_s=-2", r"num\.timeout_s=-2\.0: a duration must be positive"),
        ("delay_s=-1", r"num\.delay_s=-1\.0: a duration must be positive"),
        ("offset=nan", r"num\.offset=nan: must be a finite number"),
    ],
)
def test_check_numbers_refuses_meaningless_numbers(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(Numbers, [override])


def test_check_numbers_accepts_what_is_meaningful() -> None:
    cfg = load_config(Numbers, ["offset=-2.5", "delay_s=0", "limit=null", "count=0", "on=true"])
    assert (cfg.offset, cfg.delay_s, cfg.limit, cfg.count, cfg.on) == (-2.5, 0.0, None, 0, True)


def test_writable_dir_names_the_key_instead_of_raising_oserror(tmp_path: Path) -> None:
    assert writable_dir(tmp_path / "a" / "b", "output_dir") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())
    (tmp_path / "file").write_text("x")
    for bad in ("/proc/nope", str(tmp_path / "file" / "sub")):
        with pytest.raises(ConfigError, match=rf"output_dir={bad}: cannot write there"):
            writable_dir(bad, "output_dir")


def test_writable_dir_without_create_checks_the_nearest_parent_and_creates_nothing(
    tmp_path: Path,
) -> None:
    target = tmp_path / "a" / "b"
    assert writable_dir(target, "output_dir", create=False) == target
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a writable directory"):
        writable_dir(tmp_path / "file" / "sub", "output_dir", create=False)
