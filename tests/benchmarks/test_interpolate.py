"""benchmarks/interpolate.py: the mix of two models' weights, and the "before" a run pairs with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.interpolate import before_dir, interpolate


def test_the_mix_is_the_start_plus_alpha_times_the_change_in_each_tensors_dtype() -> None:
    start = {"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([4.0], dtype=torch.bfloat16)}
    end = {"a": torch.tensor([3.0, 2.0]), "b": torch.tensor([0.0], dtype=torch.bfloat16)}
    assert interpolate(start, end, 0.0)["a"].tolist() == [1.0, -2.0]
    assert interpolate(start, end, 1.0)["a"].tolist() == [3.0, 2.0]
    assert interpolate(start, end, 2.0)["a"].tolist() == [5.0, 6.0]  # past the end (ExPO)
    quarter = interpolate(start, end, 0.25)
    assert quarter["a"].tolist() == [1.5, -1.0]
    assert quarter["b"].dtype == torch.bfloat16 and quarter["b"].tolist() == [3.0]


def test_models_that_differ_in_tensors_or_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in tensors"):
        interpolate({"a": torch.zeros(1)}, {"b": torch.zeros(1)}, 0.5)
    with pytest.raises(ValueError, match="shape"):
        interpolate({"a": torch.zeros(2)}, {"a": torch.zeros(3)}, 0.5)


def test_a_run_pairs_with_its_own_before_else_the_one_its_seed_shares(tmp_path: Path) -> None:
    run = tmp_path / "seed0" / "variant"
    (run / "eval").mkdir(parents=True)
    assert before_dir(run) == tmp_path / "seed0" / "before"
    (run / "eval" / "before").mkdir()
    assert before_dir(run) == run / "eval" / "before"
