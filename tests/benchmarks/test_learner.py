"""benchmarks/learner.py: the synthetic batch, and a tiny run of every configuration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import learner


def test_synthetic_batch_is_grouped_ragged_and_masked() -> None:
    batch = learner.synthetic_batch(8, 48, vocab=100, group_size=4)
    assert len(batch) == 8
    assert {t.group_id for t in batch} == {"g0", "g1"}
    assert all(40 <= len(t.sequence_ids) <= 48 for t in batch)
    for t in batch:
        assert max(t.sequence_ids) < 100
        prompt = len(t.sequence_ids) // 3
        assert t.loss_mask[:prompt] == (0,) * prompt and all(t.loss_mask[prompt:])
        assert t.num_policy_tokens == len(t.sequence_ids) - prompt


@pytest.mark.slow
def test_tiny_run_prints_ratios_and_push_latency(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    result = learner.main(
        ["--model", "tiny", "--rows", "4", "--seq-len", "32", "--steps", "1",
         "--push-repeats", "1", "--json", str(tmp_path / "l.json")]
    )  # fmt: skip
    train = result["train"]
    assert set(train["configs"]) == {"plain", "fsdp1", "fsdp2"}
    assert set(train["ratios"]) == {"fsdp1_vs_plain", "fsdp2_vs_plain"}
    assert result["push"]["builtin"]["disk_median_s"] > 0
    assert result["push"]["builtin"]["object_store_median_s"] > 0
    out = capsys.readouterr().out
    assert "us/trained token" in out and "built-in server" in out
    assert "through Ray's object store" in out
