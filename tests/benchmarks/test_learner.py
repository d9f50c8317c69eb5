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
    stages = result["push"]["builtin"]["object_store_stages_median_s"]
    assert set(stages) == {"put_s", "get_s", "write_s", "load_s"}  # the push, stage by stage
    out = capsys.readouterr().out
    assert "us/trained token" in out and "built-in server" in out
    assert "through Ray's object store" in out


def test_code_batch_shares_the_rendered_system_prompt_and_tool_schemas() -> None:
    from areal_agents.trainers.modeling import tiny_model_path

    batch = learner.code_batch(6, str(tiny_model_path()), group_size=4)
    assert len(batch) == 6 and [t.group_id for t in batch] == ["g0"] * 4 + ["g1"] * 2
    shape = learner.batch_shape(batch)
    assert 300 < shape["shared_prefix"] < shape["min_len"]  # what every code episode starts with
    for t in batch:
        first = t.loss_mask.index(1)
        assert all(t.loss_mask[first:]) and not any(t.loss_mask[:first])
        assert first >= shape["shared_prefix"]


@pytest.mark.slow
def test_a_tiny_code_run_times_sharing_on_and_off(capsys) -> None:  # type: ignore[no-untyped-def]
    result = learner.main(
        ["--model", "tiny", "--workload", "code", "--rows", "4", "--steps", "1",
         "--micro-batch-tokens", "2048", "--threads", "1", "--configs", "fsdp1",
         "--share", "both", "--no-push"]
    )  # fmt: skip
    train = result["train"]
    assert set(train["configs"]) == {"fsdp1", "fsdp1_noshare"}
    on, off = train["configs"]["fsdp1"], train["configs"]["fsdp1_noshare"]
    assert on["forward_tokens"] < 0.6 * off["forward_tokens"]
    assert on["threads_per_rank"] == 1 and on["tokens_per_s"] > 0
    assert set(train["ratios"]) == {"fsdp1_share_vs_noshare"}
    assert train["batch"]["shared_prefix"] > 300
    assert "fsdp1_noshare" in capsys.readouterr().out
