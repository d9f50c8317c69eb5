"""Held-out tasks: the ones ``python -m areal_agents.eval`` plays, never trained on, and the
closing screen that reports them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from areal_agents.config import load_config
from areal_agents.envs.registry import make_env
from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.trainers.config import EnvConfig, TrainConfig
from areal_agents.trainers.data import avoid_tasks, task_id_of, task_seed
from areal_agents.trainers.held_out import closing_screen, held_out_task_ids, task_family
from areal_agents.trainers.rollout_worker import LocalBuffer, RolloutWorker
from tests.trainers.test_rollout_worker import AnswerPolicy, run


def test_task_id_of_names_the_task_reset_draws() -> None:
    env = make_env("calculator")
    for seed in (0, 1, 17, 2**31):
        env.reset(seed=seed)
        assert task_id_of(env, seed) == env.unwrapped.task.id  # type: ignore[attr-defined]


def test_held_out_tasks_and_seed_pick_the_eval_commands_tasks() -> None:
    def ids(*overrides: str) -> frozenset[str] | None:
        return held_out_task_ids(load_config(TrainConfig, ["env=calculator", *overrides]))

    env = make_env("calculator")
    eval_tasks = []
    for i in range(6):  # python -m areal_agents.eval seed=3: task i is reset(seed=3 + i)
        env.reset(seed=3 + i)
        eval_tasks.append(env.unwrapped.task.id)  # type: ignore[attr-defined]
    only = "eval.validation_tasks=0"  # the held-out tasks alone
    assert ids("eval.held_out_tasks=5", "eval.seed=3", only) == frozenset(eval_tasks[:5])
    assert ids("eval.held_out_tasks=5", "eval.seed=0", only) != frozenset(eval_tasks[:5])
    assert len(ids(only) or ()) == 128  # the default
    assert ids("eval.held_out_tasks=0") == frozenset()
    # the validation tasks (trainers/selection.py) follow them, and are never trained on either
    assert ids("eval.held_out_tasks=3", "eval.seed=3", "eval.validation_tasks=2") == frozenset(
        eval_tasks[:5]
    )
    assert ids("eval.held_out_tasks=4", "eval.seed=3") == frozenset(eval_tasks[:6])  # 4 + 4 // 2
    assert len(ids() or ()) == 128 + 64


def test_training_never_draws_a_held_out_task() -> None:
    # hold out exactly the tasks the training stream would draw first: each must be replaced
    env = make_env("calculator")
    first = [task_seed(0, i) for i in range(4)]
    held = frozenset(task_id_of(env, s) for s in first)
    assert all(task_id_of(env, avoid_tasks(env, s, held)) not in held for s in first)
    assert avoid_tasks(env, first[0], frozenset()) == first[0]  # nothing held out: unchanged

    buffer = TrajectoryBuffer(groups_per_step=4, max_staleness=0, data_seed=0)
    worker = RolloutWorker(
        EnvConfig(name="calculator", group_size=2),
        [AnswerPolicy()],
        LocalBuffer(buffer),
        max_concurrent_groups=4,
        exclude_task_ids=held,
    )
    run(worker, buffer, groups=4)
    batch = buffer.pop_batch()
    assert batch is not None and sorted(g.task.index for g in batch) == [0, 1, 2, 3]
    trained = [t.task_id for g in batch for t in g.trajectories]
    assert trained and not set(trained) & held
    for group in batch:  # the replacement is the same for every sample of a group
        assert len({t.task_id for t in group.trajectories}) == 1


def test_closing_screen_shows_before_after_and_where_things_are(tmp_path: Path) -> None:
    summary = {
        "run_dir": str(tmp_path),
        "steps": 3,
        "stop_reason": "time_budget",
        "env": "calculator",
        "model": "tiny",
        "held_out": {
            "tasks": 8,
            "before": {"success": 0.25, "viewer": str(tmp_path / "eval/before/index.html")},
            "after": {"success": 0.5, "viewer": str(tmp_path / "eval/after/index.html")},
        },
        "time_to_first_step_s": 61.0,
        "wall_s": 125.0,
        "times": {"total_s": 200.0, "eval_s": 10.0},
        "disk_mb": {"run_dir": 12.5},
        "final_weights": str(tmp_path / "weights/v000003"),
    }
    screen = closing_screen(summary)
    assert "held-out success (8 tasks never trained on, greedy): 25.0% -> 50.0%" in screen
    assert "(+25.0 points)" in screen
    assert str(tmp_path / "summary.png") in screen and str(tmp_path / "report.html") in screen
    assert str(tmp_path / "eval/after/index.html") in screen
    assert "3m 20s in all; first trained step after 1m 01s" in screen
    assert "training 2m 05s" in screen
    off = closing_screen({**summary, "time_to_first_step_without_eval_s": 41.0})
    assert "first trained step after 1m 01s (41s without the held-out evaluation)" in off
    # with a warm start: base -> after in all, and each part on its own line
    warm = {
        **summary,
        "warm_start": {"steps": 8},
        "held_out": {**summary["held_out"], "base": {"success": 0.125}},
    }
    screen = closing_screen(warm)
    assert "held-out success (8 tasks never trained on, greedy): 12.5% -> 50.0%" in screen
    assert "warm start:      12.5% -> 25.0%  (+12.5 points)  (supervised, 8 steps)" in screen
    assert "RL:              25.0% -> 50.0%  (+25.0 points)" in screen
    off = closing_screen({**summary, "held_out": {"tasks": 0}})
    assert "not measured (eval.held_out_tasks=0)" in off


def test_search_questions_fall_into_families_by_the_relation_they_ask_for() -> None:
    """search builds a knowledge base per task (``kb<seed>/<relation>/<entity>``): the family
    that moves together is the relation, so the interval by family, the per-template tables
    and ``warm_start.exclude_families`` group its tasks by relation, not one family each."""
    cfg = load_config(TrainConfig, ["env=search", "eval.held_out_tasks=40"])
    ids = held_out_task_ids(cfg) or frozenset()
    bases = {t.split("/")[0] for t in ids}
    relations = {t.split("/")[1] for t in ids}
    assert len(bases) > len(relations) >= 3  # many bases, a few relations
    assert {task_family(t) for t in ids} == {f"kb/{r}" for r in relations}


def test_eval_concurrency_is_how_many_held_out_episodes_play_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import areal_agents.eval as eval_module
    from areal_agents.errors import ConfigError
    from areal_agents.trainers.held_out import evaluate

    asked: list[int] = []  # the eval command's concurrency: its semaphore's size (eval.run_eval)

    async def played(ecfg: Any, policy: Any) -> dict[str, Any]:
        asked.append(ecfg.concurrency)
        return {"pass@1": 0.5, "episodes": ecfg.num_episodes}

    monkeypatch.setattr(eval_module, "run_eval", played)
    monkeypatch.setattr(eval_module, "_make_policy", lambda *args: None)
    for concurrency in (3, 16):
        cfg = load_config(TrainConfig, ["env=calculator", f"eval.concurrency={concurrency}"])
        result = evaluate(cfg, "http://127.0.0.1:9/v1", "policy", tmp_path / str(concurrency))
        assert result["episodes"] == 128
    assert asked == [3, 16]
    assert load_config(TrainConfig, []).eval.concurrency == 16
    with pytest.raises(ConfigError, match=r"eval\.concurrency"):
        load_config(TrainConfig, ["eval.concurrency=0"])
