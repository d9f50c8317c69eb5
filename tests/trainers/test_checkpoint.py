"""Atomic checkpoint directories and RNG capture."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from areal_agents.files import read_json, write_json
from areal_agents.trainers.checkpoint import CheckpointManager, load_rng, save_rng


def test_partial_checkpoint_is_invisible_and_cleaned(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, keep=3)
    tmp = ckpt.begin(1)
    write_json(tmp / "trainer.json", {"step": 1})
    ckpt.commit(tmp, 1)
    half = ckpt.begin(2)  # a run killed while writing step 2
    write_json(half / "trainer.json", {"step": 2})
    assert ckpt.latest() == tmp_path / "step_000001"
    assert ckpt.clean_partial() == [half]
    assert not half.exists()


def test_keep_and_recommit(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3, 3):
        tmp = ckpt.begin(step)
        write_json(tmp / "x.json", step)
        ckpt.commit(tmp, step)
    assert [CheckpointManager.step_of(p) for p in ckpt.all()] == [2, 3]
    assert read_json(tmp_path / "step_000003" / "x.json") == 3
    assert not list(tmp_path.glob("*.tmp-*"))


def test_rng_round_trip(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    save_rng(tmp_path / "rng.pkl")
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    load_rng(tmp_path / "rng.pkl")
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


def test_lean_default_keeps_one_and_the_old_one_until_the_new_one_is_whole(
    tmp_path: Path,
) -> None:
    from areal_agents.trainers.config import TrainerConfig

    keep = TrainerConfig().keep_checkpoints
    assert keep == 1  # the lean run directory: one checkpoint by default
    ckpt = CheckpointManager(tmp_path, keep=keep)
    for step in (1, 2):
        tmp = ckpt.begin(step)
        write_json(tmp / "trainer.json", {"step": step})
        if step == 2:  # being written: the old one is still there, and still the latest
            assert [p.name for p in ckpt.all()] == ["step_000001"]
        ckpt.commit(tmp, step)
    assert [p.name for p in ckpt.all()] == ["step_000002"]
    half = ckpt.begin(3)  # killed while writing step 3: step 2 stays whole and resumable
    write_json(half / "trainer.json", {"step": 3})
    assert read_json(ckpt.latest() / "trainer.json") == {"step": 2}  # type: ignore[operator]
    ckpt.clean_partial()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002"]
