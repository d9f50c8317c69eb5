"""benchmarks/async_vs_sync.py: the figures it derives, and a tiny end-to-end run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import async_vs_sync


def _row(step: int, elapsed: float, reward: float, stale: float) -> dict[str, object]:
    return {
        "step": step, "time/elapsed_s": elapsed, "episodes": 4, "tokens/policy": 100,
        "staleness/mean": stale, "staleness/max": int(stale + 0.5), "reward/mean": reward,
        "time/wait_s": 1.0, "time/train_s": 2.0, "time/sync_s": 0.5, "episode/turns_mean": 3.0,
    }  # fmt: skip


def test_summarize_derives_throughput_staleness_and_final_reward(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [_row(1, 10.0, 0.0, 0.0), _row(2, 15.0, 0.5, 1.0), _row(3, 20.0, 1.0, 2.0)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = async_vs_sync.summarize(path)
    assert s["steps"] == 3 and s["episodes"] == 12 and s["trained_tokens"] == 300
    assert s["tokens_per_s"] == pytest.approx(15.0)
    assert s["samples_per_s"] == pytest.approx(0.6)
    assert s["staleness_mean"] == pytest.approx(1.0)
    assert s["reward_final"] == pytest.approx(1.0)  # the last third of the steps
    assert s["learner_wait_frac"] == pytest.approx(3.0 / 20.0)
    assert s["curve"][-1] == [20.0, 1.0]
    assert s["after_first_tokens_per_s"] == pytest.approx(200 / 10.0)


def test_idle_fractions_count_samples_under_the_threshold(tmp_path: Path) -> None:
    m = async_vs_sync.Monitor(0, tmp_path / "m.jsonl", 0.5, threshold=0.1)
    m.samples = [
        {"t": 1.0, "generation": 0.9, "learning": 0.0},
        {"t": 2.0, "generation": 0.05, "learning": 1.5},
        {"t": 3.0, "generation": 0.8, "learning": 0.02},
        {"t": 9.0, "generation": 0.0, "learning": 0.0},  # outside the window
    ]
    idle = m.idle_fractions(0.5, 3.5)
    assert idle == {
        "generation": pytest.approx(1 / 3, abs=1e-3),
        "learning": pytest.approx(2 / 3, abs=1e-3),
    }


def test_overrides_keep_everything_but_the_staleness_equal(tmp_path: Path) -> None:
    args = async_vs_sync.main.__globals__["argparse"].Namespace(
        env="e", model="m", group_size=4, groups_per_step=2, steps=3, lr=1e-5,
        concurrent_groups=8, seed=0, max_tokens=16, extra=[],
    )  # fmt: skip
    sync = async_vs_sync._overrides(args, 0, tmp_path)
    fast = async_vs_sync._overrides(args, 4, tmp_path)
    assert "trainer.mode=sync" in sync and not any("max_staleness" in a for a in sync)
    assert {"trainer.mode=async", "trainer.max_staleness=4"} <= set(fast)
    common = {a for a in sync if not a.startswith("trainer.mode")}
    assert common <= set(fast)


@pytest.mark.slow
@pytest.mark.integration
def test_tiny_sync_and_async_runs_print_the_table(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    result = async_vs_sync.main(
        ["--model", "tiny", "--steps", "1", "--staleness", "0,1", "--groups-per-step", "1",
         "--group-size", "2", "--max-tokens", "8", "--out", str(tmp_path / "runs"),
         "--plots", str(tmp_path / "plots"), "--timeout-s", "900"]
    )  # fmt: skip
    runs = {r["setting"]: r for r in result["runs"]}
    assert set(runs) == {"sync", "async_s1"}
    assert all(r["exit_code"] == 0 and r["steps"] == 1 for r in runs.values())
    assert runs["sync"]["ratio_vs_sync"] == 1.0 and "ratio_vs_sync" in runs["async_s1"]
    assert (tmp_path / "plots" / "async_vs_sync_reward.png").is_file()
    assert "vs sync" in capsys.readouterr().out
