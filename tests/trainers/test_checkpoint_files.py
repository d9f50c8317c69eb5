"""On a cluster a learner checkpoint travels to the driver as files: the ranks never write into
the run directory (it lives with the driver only), and the files load back into any ranks."""

from __future__ import annotations

from pathlib import Path

import torch

from areal_agents.trainers.checkpoint import read_files, write_files
from tests.trainers._tiny_learner import batch, learner


def test_a_checkpoint_sent_as_files_restores_the_trained_learner(tmp_path: Path) -> None:
    trained = learner()
    trained.train_step(batch())
    files = trained.checkpoint_files()  # through the rank's own temporary directory
    assert {"learner.pt", "schedule.pt", "rng_rank0.pt"} <= set(files)
    driver = write_files(files, tmp_path / "learner")  # what the driver stores
    assert read_files(driver) == files

    fresh = learner()
    before = {k: v.clone() for k, v in fresh.full_state().items()}
    assert fresh.load_checkpoint_files(read_files(driver)) == trained.step == 1
    after, expected = fresh.full_state(), trained.full_state()
    assert any(not torch.equal(before[k], expected[k]) for k in expected)  # training moved it
    assert all(torch.equal(after[k], expected[k]) for k in expected)


def test_file_names_cannot_leave_the_directory(tmp_path: Path) -> None:
    import pytest

    with pytest.raises(ValueError, match="plain file name"):
        write_files({"../escape": b"x"}, tmp_path)
