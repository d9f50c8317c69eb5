"""benchmarks/rl_gain.py: its command line takes the variant's overrides after the options, and
its tables are computed from the stored entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import rl_gain


def entry(name: str, seed: int, gain: float, fixed: int, broken: int) -> dict[str, Any]:
    return {
        "env": "code_sandbox",
        "name": name,
        "seed": seed,
        "steps": 24,
        "update_kl": [0.001, None, 0.003],
        "held_out": {
            "before": 0.5,
            "after": 0.5 + gain / 100,
            "gain_points": gain,
            "ci95_points": [gain - 4, gain + 4],
            "improved": fixed,
            "regressed": broken,
            "mcnemar_p": 0.05,
        },
    }


def write_outcomes(where: Path, ids: list[str], solved: list[bool]) -> None:
    """Held-out transcripts in ``where``: task ``i`` is ``ids[i]``, solved or not."""
    where.mkdir(parents=True)
    pairs = zip(ids, solved, strict=True)
    rows = [{"task_index": i, "task_id": t, "reward": float(ok)} for i, (t, ok) in enumerate(pairs)]
    (where / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_overrides_may_follow_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    def fake_run(env: str, seed: int, root: Any, name: str, overrides: Any, held: int) -> Any:
        seen.append((env, seed, name, list(overrides), held))
        return entry(name, seed, 1.0, 1, 0)

    monkeypatch.setattr(rl_gain, "run_variant", fake_run)
    monkeypatch.setattr(rl_gain, "_store", lambda e: None)
    rl_gain.main(["run", "--seeds", "1,2", "--name", "v", "trainer.lr=1e-5", "algo=grpo"])
    assert seen == [
        ("code_sandbox", 1, "v", ["trainer.lr=1e-5", "algo=grpo"], 128),
        ("code_sandbox", 2, "v", ["trainer.lr=1e-5", "algo=grpo"], 128),
    ]


def test_by_variant_sums_the_seeds_of_each_variant() -> None:
    entries = [
        entry("real", 0, 12.5, 18, 2),
        entry("real", 1, 8.0, 12, 2),
        entry("placebo", 0, -1.5, 3, 5),
        {**entry("broken", 0, 0.0, 0, 0), "held_out": None},  # a run without its evaluation
    ]
    table = rl_gain.by_variant(entries)
    rows = [line for line in table.splitlines() if line.startswith("| code_sandbox")]
    assert len(rows) == 2  # the run without a held-out result is left out
    placebo, real = rows  # sorted by name
    assert "| placebo | 0 | -1.5 | **-1.5** | -1.5 | 3 / 5 |" in placebo
    assert "| real | 0,1 | +12.5, +8.0 | **+10.2** | +8.0 | 30 / 4 | 2.00e-03 |" in real
    assert "+12.5** (+8.5 to +16.5)" in rl_gain.table(entries[:1])
    assert rl_gain.table(entries[:1]).endswith("| 24 | 4.0e-03 / 3.0e-03 |")  # sum / max
    assert "| - | 18 / 2 |" in rl_gain.table(entries[:1])  # no family interval stored
    # validation chose step 12 of 24: the steps cell says so, and a row has the last step's
    last = entry("x", 0, -6.0, 1, 9)["held_out"]
    chosen = {**entries[0], "selection": {"chosen_step": 12}, "held_out_last": last}
    rows = rl_gain.table([chosen]).splitlines()[2:]
    assert len(rows) == 2 and all("| 24 (final: 12) |" in r for r in rows)
    assert "(last step) | 0 |" in rows[1] and "**-6.0**" in rows[1] and "| 1 / 9 |" in rows[1]
    same = {**entries[0], "selection": {"chosen_step": 24}}  # the last step chosen: as before
    assert rl_gain.table([same]) == rl_gain.table(entries[:1])


def test_rescore_recomputes_each_comparison_by_family_from_the_runs(tmp_path: Path) -> None:
    seed_dir = tmp_path / "code_sandbox-seed0"
    ids = [f"gen/t{i % 12}/{i}" for i in range(48)]
    write_outcomes(seed_dir / "before", ids, [False] * 48)
    write_outcomes(seed_dir / "real" / "eval" / "after", ids, [i % 12 < 3 for i in range(48)])
    stored = [entry("real", 0, 99.0, 0, 0), entry("gone", 0, 1.0, 1, 0)]  # gone: no runs
    got = rl_gain.rescore(stored, tmp_path)
    real = got[0]["held_out"]
    assert (real["improved"], real["gain_points"], real["families"]) == (12, 25.0, 12)
    assert real["family_ci95_points"][0] < real["ci95_points"][0]
    assert got[1] == stored[1]  # kept as it was
    assert "| 12 / 0 |" in rl_gain.table(got[:1]) and "(12) |" in rl_gain.table(got[:1])
    # a warm start that left families out: the RL gain on them and on the rest, row by row
    (seed_dir / "warm_start.json").write_text(json.dumps({"exclude_families": ["gen/t0"]}))
    split = rl_gain.rescore(stored, tmp_path)[0]["held_out"]
    assert split["rl_gain_undemonstrated"]["improved"] == 4  # gen/t0's 4 tasks
    assert split["rl_gain_demonstrated"]["improved"] == 8 and split["improved"] == 12
    rows = rl_gain.table([{**stored[0], "held_out": split}]).splitlines()[2:]
    assert [r.split(" | ")[1] for r in rows] == [
        "real",
        "real (undemonstrated)",
        "real (demonstrated)",
    ]


def test_the_same_variant_name_under_two_roots_is_two_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Results are kept per root: storing a name under a second root adds a result, and
    rescoring one root leaves the other's (whose runs it does not hold) as stored, even where
    that root has a run of the same name."""
    seed_dir = tmp_path / "a" / "code_sandbox-seed0"
    ids = [f"gen/t/{i}" for i in range(4)]
    write_outcomes(seed_dir / "before", ids, [False] * 4)
    write_outcomes(seed_dir / "real" / "eval" / "after", ids, [True] * 4)
    monkeypatch.setattr(rl_gain, "RESULTS", tmp_path / "rl_gain.json")
    here = {**entry("real", 0, 1.0, 1, 0), "root": str(tmp_path / "a")}
    # stored before entries named their root: found from the command's output_dir
    there = {**entry("real", 0, 2.0, 2, 0), "command": f"x output_dir={tmp_path}/b/c-seed0/real"}
    rl_gain._store(here)
    rl_gain._store(there)
    rl_gain._store({**here, "steps": 23})  # the same root again: replaced
    stored = json.loads((tmp_path / "rl_gain.json").read_text())
    assert [(e["held_out"]["improved"], e["steps"]) for e in stored] == [(2, 24), (1, 23)]
    assert rl_gain.root_of(stored[0]) == tmp_path / "b"
    got = rl_gain.rescore(stored, tmp_path / "a")
    assert got[0] == stored[0]  # root b's result, not a's run of the same name
    assert got[1]["held_out"]["improved"] == 4  # root a's, from its transcripts


def test_a_run_from_a_warm_start_with_families_left_out_keeps_them_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_dir = tmp_path / "code_sandbox-seed0"
    seed_dir.mkdir()
    info = {"train_s": 100.0, "exclude_families": ["gen/rotate", "gen/fizz"]}
    (seed_dir / "warm_start.json").write_text(json.dumps(info))
    commands: list[list[str]] = []

    def fake(command: list[str], **_: Any) -> None:  # the train run stops short of a summary
        commands.append(command)
        raise RuntimeError("not run")

    monkeypatch.setattr(rl_gain.subprocess, "run", fake)
    with pytest.raises(RuntimeError, match="not run"):
        rl_gain.run_variant("code_sandbox", 0, tmp_path, "v", ["algo.replay_coef=1"], 128)
    (command,) = commands
    # the replay draws its pool as the warm start drew it, and the run's report splits RL's gain
    assert command[-1] == "warm_start.exclude_families=[gen/rotate,gen/fizz]"
    assert "trainer.time_budget_s=1100" in command


def test_compare_pairs_two_variants_per_seed_pooled_and_split(tmp_path: Path) -> None:
    ids = [f"gen/t{i % 12}/{i}" for i in range(48)]
    for seed, fixed_by_a in ((0, 3), (1, 2)):
        seed_dir = tmp_path / f"code_sandbox-seed{seed}"
        write_outcomes(seed_dir / "before", ids, [False] * 48)
        write_outcomes(seed_dir / "b" / "eval" / "after", ids, [i % 12 == 0 for i in range(48)])
        a_solved = [i % 12 < fixed_by_a for i in range(48)]  # B's template t0, and more
        a_solved[0] = False  # one task of t0 that B solved, lost
        write_outcomes(seed_dir / "a" / "eval" / "after", ids, a_solved)
        (seed_dir / "warm_start.json").write_text(json.dumps({"exclude_families": ["gen/t1"]}))
    write_outcomes(tmp_path / "code_sandbox-seed2" / "before", ids, [False] * 48)  # no runs

    out = rl_gain.compare("code_sandbox", [0, 1, 2], tmp_path, "a", "b")
    rows = {tuple(r.split(" | ")[2:4]): r for r in out.splitlines()[2:]}
    sides = ("all", "undemonstrated", "demonstrated")
    # seed 2 has neither variant: skipped
    assert list(rows) == [(s, side) for s in ("0", "1", "pooled") for side in sides]
    fixed_broken = {k: r.split(" | ")[8] for k, r in rows.items()}
    assert fixed_broken[("0", "all")] == "8 / 1"  # t1 and t2 gained (4 each), one t0 task lost
    assert fixed_broken[("0", "undemonstrated")] == "4 / 0"  # t1 only
    assert fixed_broken[("1", "all")] == "4 / 1"
    assert fixed_broken[("pooled", "all")] == "12 / 2"
    assert fixed_broken[("pooled", "undemonstrated")] == "8 / 0"
    assert "(24) |" in rows[("pooled", "all")]  # 12 templates of each seed, resampled as clusters
    assert "| 8.3% | 22.9% |" in rows[("0", "all")]  # b, then a
    against_before = rl_gain.compare("code_sandbox", [0], tmp_path, "a", "before")
    assert "| 0.0% | 22.9% |" in against_before.splitlines()[2]


def test_compare_pools_the_repeats_of_a_variant_by_family(tmp_path: Path) -> None:
    ids = [f"gen/t{i % 12}/{i}" for i in range(48)]
    seed_dir = tmp_path / "code_sandbox-seed0"
    write_outcomes(seed_dir / "before", ids, [i % 12 < 6 for i in range(48)])
    # one run fixes template t6 (4 tasks), its repeat breaks t0 (4 tasks) and fixes nothing
    write_outcomes(seed_dir / "r1" / "eval" / "after", ids, [i % 12 < 7 for i in range(48)])
    write_outcomes(seed_dir / "r2" / "eval" / "after", ids, [0 < i % 12 < 6 for i in range(48)])
    out = rl_gain.compare("code_sandbox", [0], tmp_path, "r1,r2,missing", "before")
    cells = {r.split(" | ")[2]: r.split(" | ") for r in out.splitlines()[2:]}
    assert list(cells) == ["0", "pooled"]  # a repeat with no run is left out
    for seed in cells:
        # 96 pairs: 50.0% -> 50.0%, 4 fixed and 4 broken; the 12 templates are the clusters,
        # each holding its tasks of both runs
        assert cells[seed][4:6] == ["50.0%", "50.0%"]
        assert cells[seed][6].startswith("**+0.0**")
        assert cells[seed][7].endswith("(12)") and cells[seed][8] == "4 / 4"
    alone = rl_gain.compare("code_sandbox", [0], tmp_path, "r1", "before").splitlines()[2]
    assert alone.split(" | ")[8] == "4 / 0" and "**+8.3**" in alone
    with pytest.raises(ValueError, match="no variant"):
        rl_gain.compare("code_sandbox", [0], tmp_path, ",", "before")


def test_compare_reads_runs_whose_directories_are_gone_from_their_stored_records(
    tmp_path: Path,
) -> None:
    """The runs live under ``runs/``, which goes with the machine: each entry keeps its held-out
    outcomes task by task, and ``compare`` pools them as it pools the runs themselves, the
    warm start's left-out families included."""
    import shutil

    ids = [f"gen/t{i % 12}/{i}" for i in range(48)]
    seed_dir = tmp_path / "code_sandbox-seed0"
    write_outcomes(seed_dir / "before", ids, [i % 12 < 6 for i in range(48)])
    write_outcomes(seed_dir / "r1" / "eval" / "after", ids, [i % 12 < 7 for i in range(48)])
    write_outcomes(seed_dir / "r2" / "eval" / "after", ids, [0 < i % 12 < 6 for i in range(48)])
    (seed_dir / "warm_start.json").write_text(json.dumps({"exclude_families": ["gen/t6"]}))
    live = rl_gain.compare("code_sandbox", [0], tmp_path, "r1,r2", "before")
    stored = [
        {
            **entry(n, 0, 0.0, 0, 0),
            "root": str(tmp_path),
            "tasks": rl_gain.task_record(seed_dir, seed_dir / n),
        }
        for n in ("r1", "r2")
    ]
    assert stored[0]["tasks"]["after"]["6"] == 1 and stored[1]["tasks"]["before"]["6"] == 0
    shutil.rmtree(seed_dir)  # another machine: no run, no "before", no warm_start.json
    header = "\n".join(live.splitlines()[:2])  # the table with no row: nothing to pair
    assert rl_gain.compare("code_sandbox", [0], tmp_path, "r1,r2", "before") == header
    assert rl_gain.compare("code_sandbox", [0], tmp_path, "r1,r2", "before", stored) == live
    assert "undemonstrated" in live  # the split came back from the record too
    elsewhere = [{**e, "root": str(tmp_path / "other")} for e in stored]  # another root's runs
    assert rl_gain.compare("code_sandbox", [0], tmp_path, "r1,r2", "before", elsewhere) == header


def test_a_run_whose_final_policy_was_chosen_keeps_its_last_step_s_outcomes(
    tmp_path: Path,
) -> None:
    """Where validation chose a final policy other than the last step's
    (``trainers/selection.py``), the run's ``eval/last`` holds the last step's held-out
    outcomes: the entry pairs them with "before" too, and keeps them task by task."""
    ids = [f"gen/t{i % 12}/{i}" for i in range(24)]
    seed_dir = tmp_path / "code_sandbox-seed0"
    write_outcomes(seed_dir / "before", ids, [i % 12 < 6 for i in range(24)])
    write_outcomes(seed_dir / "r" / "eval" / "after", ids, [i % 12 < 6 for i in range(24)])
    assert rl_gain._paired(seed_dir, seed_dir / "r", "last") is None  # the last step was chosen
    assert rl_gain.task_record(seed_dir, seed_dir / "r")["last"] == {}
    write_outcomes(seed_dir / "r" / "eval" / "last", ids, [i % 12 < 4 for i in range(24)])
    last = rl_gain._paired(seed_dir, seed_dir / "r", "last")
    assert last is not None and last["regressed"] == 4 and last["improved"] == 0
    assert rl_gain._paired(seed_dir, seed_dir / "r")["gain_points"] == 0.0  # type: ignore[index]
    record = rl_gain.task_record(seed_dir, seed_dir / "r")
    assert record["last"]["4"] == 0 and record["after"]["4"] == 1
