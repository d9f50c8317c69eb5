"""Held-out changes are judged on the same tasks, with an interval: from the evaluations'
transcripts to ``summary.json``'s ``rl_gain`` and the closing screen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_agents.stats import compare_paired, mcnemar_p, paired_bootstrap, wilson_interval
from areal_agents.trainers.held_out import (
    closing_screen,
    paired_gains,
    task_families,
    task_successes,
)
from areal_agents.trainers.report import held_out_view


def _eval(
    directory: Path, solved: list[bool], threshold: float = 1.0, ids: list[str] | None = None
) -> None:
    directory.mkdir(parents=True)
    rows = [{"task_index": i, "reward": 1.0 if ok else 0.5} for i, ok in enumerate(solved)]
    for row, task_id in zip(rows, ids or [], strict=False):
        row["task_id"] = task_id
    (directory / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "summary.json").write_text(json.dumps({"pass_threshold": threshold}))


def test_paired_gains_pair_tasks_and_name_the_interval(tmp_path: Path) -> None:
    before = [i % 4 != 0 for i in range(128)]  # 96 solved
    after = [ok or i % 8 == 0 for i, ok in enumerate(before)]  # 16 more: 112
    after[1] = False  # one broken
    _eval(tmp_path / "base", [False] * 128)
    _eval(tmp_path / "before", before)
    _eval(tmp_path / "after", after)
    gains = paired_gains(tmp_path)
    rl = gains["rl_gain"]
    assert (rl["n"], rl["improved"], rl["regressed"]) == (128, 16, 1)
    assert rl["gain_points"] == pytest.approx(100 * 15 / 128, abs=0.05)
    assert rl["mcnemar_p"] == pytest.approx(mcnemar_p(16, 1), abs=1e-4) and rl["mcnemar_p"] < 0.01
    lo, hi = rl["ci95_points"]
    assert 0 < lo < rl["gain_points"] < hi
    assert gains["warm_start_gain"]["improved"] == 96 and gains["gain"]["improved"] == 111
    # a threshold below the 0.5 rewards counts them all solved
    _eval(tmp_path / "lenient", [False] * 4, threshold=0.5)
    assert task_successes(tmp_path / "lenient") == {0: True, 1: True, 2: True, 3: True}
    assert task_successes(tmp_path / "missing") is None
    summary = {
        "held_out": {
            "tasks": 128,
            "base": {"success": 0.0},
            "before": {"success": 96 / 128},
            "after": {"success": 111 / 128},
            **gains,
        }
    }
    screen = closing_screen(summary)
    assert "RL:              75.0% -> 86.7%  (+11.7 points (95% CI +" in screen
    assert "16 fixed, 1 broken; McNemar p=" in screen


def test_intervals_by_hand() -> None:
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)  # 2 * (1/2)^5
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-3)
    same = paired_bootstrap([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
    assert same == (0.0, 0.0)
    c = compare_paired({"a": True, "b": False, "c": False}, {"a": True, "b": True, "d": True})
    assert (c.n, c.improved, c.regressed, c.before, c.after) == (2, 1, 0, 0.5, 1.0)
    with pytest.raises(ValueError, match="share no task"):
        compare_paired({"a": True}, {"b": True})


def test_tasks_of_one_family_are_resampled_together() -> None:
    # 24 families of 5 tasks; 4 whole families fixed: 20 tasks, but 4 units of evidence
    before = [0.0] * 120
    after = [1.0 if i < 20 else 0.0 for i in range(120)]
    families = [i // 5 for i in range(120)]
    lo, hi = paired_bootstrap(before, after)
    flo, fhi = paired_bootstrap(before, after, clusters=families)
    assert flo < lo and fhi > hi  # the family interval is the wider, honest one
    assert flo < 100 / 6 / 100 < fhi
    # one task per family: the cluster bootstrap is the task bootstrap, draw for draw
    singles = list(range(120))
    assert paired_bootstrap(before, after, clusters=singles) == (lo, hi)
    # each draw's mean is over the tasks it holds (families of unequal size, one difference)
    assert paired_bootstrap([0.0] * 6, [1.0] * 6, clusters=[0, 0, 0, 0, 0, 1]) == (1.0, 1.0)
    with pytest.raises(ValueError, match="2 cluster labels for 3 pairs"):
        paired_bootstrap([0.0] * 3, [1.0] * 3, clusters=[0, 1])


def test_compare_paired_reports_the_family_interval_only_where_families_group_tasks() -> None:
    before = {i: False for i in range(40)}
    after = {i: i < 10 for i in range(40)}
    plain = compare_paired(before, after)
    assert plain.families is None and plain.family_ci95_points is None
    own = compare_paired(before, after, families={})  # every task its own family: no clusters
    assert own.family_ci95_points is None
    grouped = compare_paired(before, after, families={i: i // 4 for i in range(40)})
    assert grouped.families == 10 and grouped.family_ci95_points is not None
    assert grouped.family_ci95_points[0] < grouped.ci95_points[0]
    record = grouped.to_json()
    assert type(grouped).from_json(record).to_json() == record
    assert "; 95% CI by family (10) " in grouped.describe()
    # too few families to resample (a bootstrap over 4 values misstates the spread): none
    few = compare_paired(before, after, families={i: i // 10 for i in range(40)})
    assert few.families is None and few.family_ci95_points is None
    assert "by family" not in plain.describe()


def test_paired_gains_and_the_closing_screen_show_the_interval_by_template(tmp_path: Path) -> None:
    # 48 tasks of 12 code templates (gen/<template>/<seed>); RL fixes two whole templates
    ids = [f"gen/t{i % 12}/{1000 + i}" for i in range(48)]
    ids[47] = "HumanEval/3"  # a task of no family: its own
    _eval(tmp_path / "before", [False] * 48, ids=ids)
    _eval(tmp_path / "after", [i % 12 < 2 for i in range(48)], ids=ids)
    families = task_families(tmp_path / "after")
    assert families[0] == "gen/t0" and 47 not in families and len(set(families.values())) == 12
    rl = paired_gains(tmp_path)["rl_gain"]
    assert rl["families"] == 13 and rl["improved"] == 8
    assert rl["family_ci95_points"][0] < rl["ci95_points"][0]
    summary = {"held_out": {"tasks": 48, "before": {"success": 0.0}, "after": {"success": 1 / 6},
                            "rl_gain": rl}}  # fmt: skip
    assert "95% CI by family (13) " in closing_screen(summary)
    assert task_families(tmp_path / "missing") == {}


def test_rl_gain_is_split_between_demonstrated_and_undemonstrated_families(
    tmp_path: Path,
) -> None:
    # 48 tasks of 12 templates; t0-t5 were never demonstrated (warm_start.exclude_families)
    ids = [f"gen/t{i % 12}/{1000 + i}" for i in range(48)]
    ids[47] = "HumanEval/3"  # no family: counted with the demonstrated ones
    _eval(tmp_path / "before", [i % 12 >= 6 for i in range(48)], ids=ids)
    after = [i % 12 >= 6 or i % 12 < 2 for i in range(48)]  # RL fixes t0 and t1 (8 tasks)
    after[6] = False  # and breaks one demonstrated task
    _eval(tmp_path / "after", after, ids=ids)
    hidden = [f"gen/t{k}" for k in range(6)]
    gains = paired_gains(tmp_path, hidden)
    new, old = gains["rl_gain_undemonstrated"], gains["rl_gain_demonstrated"]
    assert (new["n"], new["improved"], new["regressed"], new["before"]) == (24, 8, 0, 0.0)
    assert (old["n"], old["improved"], old["regressed"], old["before"]) == (24, 0, 1, 1.0)
    assert gains["rl_gain"]["n"] == 48 and gains["rl_gain"]["improved"] == 8
    assert "rl_gain_undemonstrated" not in paired_gains(tmp_path)  # no split asked for
    screen = closing_screen({"held_out": {"tasks": 48, "before": {}, "after": {}, **gains}})
    assert "on families never demonstrated (24 tasks):  (+33.3 points" in screen
    assert "on demonstrated families (24 tasks):  (-4.2 points" in screen
    view = held_out_view({"held_out": {"tasks": 48, **gains}}, tmp_path)  # report.html
    changes = {c["key"]: c for c in view["changes"]}
    assert changes["rl_gain_undemonstrated"]["label"] == "RL, on families never demonstrated"
    assert changes["rl_gain_undemonstrated"]["improved"] == 8
