"""benchmarks/async_parity.py: each async cell is paired with its own seed's sync run, task by
task, and its correction's figures come from its metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import async_parity


def _run(
    root: Path, out: str, setting: str, solved: list[bool], rows: list[dict[str, Any]]
) -> None:
    run = root / out / setting
    (run / "eval" / "after").mkdir(parents=True)
    episodes = [{"task_index": i, "reward": float(ok)} for i, ok in enumerate(solved)]
    (run / "eval" / "after" / "transcripts.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in episodes)
    )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _result(
    out: str, mode: str, seed: int, extra: list[str], loss: str = "decoupled_ppo", **args: Any
) -> dict[str, Any]:
    bound = 0 if mode == "sync" else 4
    run = {"setting": f"{mode}_seed{seed}", "mode": mode, "seed": seed, "staleness_bound": bound,
           "tokens_per_s": 20.0, "held_out": {"success_after": 0.5}}  # fmt: skip
    return {"args": {"out": out, "loss": loss, "extra": extra, **args}, "runs": [run]}


def test_cells_pair_with_their_seeds_sync_run_and_read_their_corrections(tmp_path: Path) -> None:
    rows = [
        {"tokens/policy": 100, "staleness/token_mean": 1.0, "staleness/token_max": 2,
         "behavior/masked_frac": 0.1, "behavior/kl": 0.01,
         "staleness/turns1_mean": 1.0, "batch/turns1_episodes": 6,
         "staleness/turns8_mean": 2.0, "batch/turns8_episodes": 2},
        {"tokens/policy": 300, "staleness/token_mean": 3.0, "staleness/token_max": 4,
         "behavior/masked_frac": 0.3, "behavior/kl": 0.05,
         "staleness/turns2_mean": 3.0, "batch/turns2_episodes": 2,
         "staleness/turns16_mean": 4.0, "batch/turns16_episodes": 6},
    ]  # fmt: skip
    # seed 0: sync solves tasks 0-3 of 8; the cell keeps 0-1, loses 2-3, gains 4-7
    _run(tmp_path, "p/sync", "sync_seed0", [True] * 4 + [False] * 4, rows)
    _run(tmp_path, "p/mask", "async_s4_seed0", [True, True, False, False] + [True] * 4, rows)
    # seed 1's sync run solves everything: the seed-0 cell must not be paired with it
    _run(tmp_path, "p/sync1", "sync_seed1", [True] * 8, rows)
    results = [
        _result(
            "p/mask", "async_s4", 0, ["model.compute_dtype=bfloat16", "algo.behavior_imp_mode=mask"]
        ),
        _result("p/sync", "sync", 0, ["model.compute_dtype=bfloat16"]),
        _result("p/sync1", "sync", 1, []),
    ]
    got = async_parity.parity_rows(results, root=tmp_path)
    cell = next(r for r in got if r["cell"] != "sync" and r["seed"] == 0)
    assert cell["cell"] == "async_s4 decoupled_ppo [mode=mask]"
    vs = cell["vs_sync"]
    assert (vs["improved"], vs["regressed"], vs["n"]) == (4, 2, 8)
    assert vs["gain_points"] == pytest.approx(25.0)  # 6/8 against 4/8
    assert cell["staleness_token_mean"] == pytest.approx((1 * 100 + 3 * 300) / 400)
    assert cell["staleness_token_max"] == 4
    # episode-weighted by length: 1-2 turns (6 at 1.0, 2 at 3.0), 8+ turns (2 at 2.0, 6 at 4.0)
    assert cell["staleness_short_episodes"] == pytest.approx(1.5)
    assert cell["staleness_long_episodes"] == pytest.approx(3.5)
    assert cell["masked_frac"] == pytest.approx(0.2) and cell["behavior_kl_max"] == pytest.approx(
        0.05
    )
    assert all("vs_sync" not in r for r in got if r["cell"] == "sync")
    assert "| 0 | async_s4 decoupled_ppo [mode=mask] (mask) | 50.0% | +25.0" in async_parity.table(
        got
    )


def test_the_loss_of_a_cell_names_it() -> None:
    assert async_parity.cell_label({"loss": "ppo_clip", "extra": []}, "async_s8") == (
        "async_s8 ppo_clip [defaults]"
    )
    args = {
        "loss": "decoupled_ppo",
        "extra": ["algo.loss=reinforce", "algo.behavior_imp_level=sequence"],
    }
    assert async_parity.cell_label(args, "async_s4") == "async_s4 reinforce [level=sequence]"
    assert async_parity.cell_label(args, "sync") == "sync"
    lr = async_parity.cell_label({**args, "lr": 1e-5}, "async_s4")
    assert lr == "async_s4 reinforce [level=sequence, lr=1e-05]"
    assert async_parity.cell_label({**args, "lr": 1e-5}, "sync") == "sync [lr=1e-05]"


def test_a_cell_pairs_with_the_sync_run_of_its_own_learning_rate(tmp_path: Path) -> None:
    # seed 0 at two learning rates: sync at 2e-5 solves 0-3 of 8, sync at 1e-5 solves all 8
    _run(tmp_path, "p/sync", "sync_seed0", [True] * 4 + [False] * 4, [])
    _run(tmp_path, "p/sync_lo", "sync_seed0", [True] * 8, [])
    _run(tmp_path, "p/lo", "async_s4_seed0", [True] * 6 + [False] * 2, [])
    results = [
        _result("p/lo", "async_s4", 0, [], lr=1e-5),
        _result("p/sync", "sync", 0, [], lr=2e-5),
        _result("p/sync_lo", "sync", 0, [], lr=1e-5),
    ]
    got = async_parity.parity_rows(results, root=tmp_path)
    cell = next(r for r in got if r["cell"].startswith("async"))
    assert cell["cell"] == "async_s4 decoupled_ppo [lr=1e-05]"
    vs = cell["vs_sync"]  # 6/8 against the 1e-5 sync run's 8/8, not the 2e-5 run's 4/8
    assert (vs["improved"], vs["regressed"]) == (0, 2)
    assert vs["gain_points"] == pytest.approx(-25.0)
    # a cell whose learning rate has no sync run is not paired with another rate's
    alone = async_parity.parity_rows(results[:2], root=tmp_path)
    assert "vs_sync" not in next(r for r in alone if r["cell"].startswith("async"))
