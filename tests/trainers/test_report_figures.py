"""What report.html says a run measured: held-out success with its intervals (and the paired
changes), tool calls and turns per episode, the start-up figures, the policy-movement charts;
read off the page in headless Chromium. And a report that survives any text."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from areal_agents.stats import wilson_interval
from areal_agents.trainers.report import held_out_view, render_report, write_report
from tests.trainers.test_report import DevTools, embedded, make_run

ROOT = Path(__file__).resolve().parents[2]

#: summary.json of a finished 6-step run, as trainers/loop.py writes it (the figures of issue
#: 31's fresh clone: 26.6% / 73.4% / 73.4% on 64 tasks), with the paired changes of
#: trainers/held_out.py:paired_gains.
SUMMARY: dict[str, Any] = {
    "finished": True,
    "steps": 6,
    "stop_reason": "time_budget",
    "time_to_first_step_s": 95.25,
    "time_to_first_step_without_eval_s": 41.5,
    "startup": {"imports_s": 6.4, "prepare_s": 1.2, "ray_s": 3.1, "first_train_s": 12.0},
    "held_out": {
        "tasks": 64,
        "seed": 900000000,
        "base": {"success": 17 / 64, "episodes": 64, "mean_reward": 0.3},
        "before": {"success": 47 / 64, "episodes": 64, "ci95": [0.615, 0.827]},
        "after": {"success": 47 / 64, "episodes": 64},
        "warm_start_gain": {
            "n": 64, "before": 0.2656, "after": 0.7344, "improved": 31, "regressed": 1,
            "gain_points": 46.9, "ci95_points": [34.4, 59.4], "mcnemar_p": 0.0,
        },
        "rl_gain": {
            "n": 64, "before": 0.7344, "after": 0.7344, "improved": 3, "regressed": 3,
            "gain_points": 0.0, "ci95_points": [-6.2, 6.2], "mcnemar_p": 1.0,
            "families": 12, "family_ci95_points": [-12.5, 10.9],
        },
        "gain": {  # a narrow interval in points, not a rate to scale by 100
            "n": 64, "before": 0.2656, "after": 0.2812, "improved": 1, "regressed": 0,
            "gain_points": 1.6, "ci95_points": [0.0, 0.8], "mcnemar_p": 1.0,
        },
    },
}  # fmt: skip


def finished_run(root: Path) -> Path:
    run = make_run(root, steps=6)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # what the learner logs per step (issue 27)
        step = row["step"]
        row.update({
            "episode/turns_mean": 1.5 + step / 4,
            "policy/update_kl": 0.001 * step,
            "behavior/kl": 0.002 * step,
            "loss/approx_kl": 0.003 * step,
            **{f"behavior/weight/{q}": v for q, v in
               (("q50", 1.0), ("q90", 1.2), ("q99", 1.6), ("max", 3.0 + step))},
            "clip/high_frac": 0.01, "clip/low_frac": 0.02, "behavior/masked_frac": 0.0,
            "correction/truncated_frac": 0.05,
        })  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps(SUMMARY))
    for when, calls, turns in (("base", 0.25, 1.2), ("before", 1.0, 2.0), ("after", 1.125, 2.5)):
        (run / "eval" / when).mkdir(parents=True)
        eval_summary = {"tool_calls_per_episode": calls, "turns_per_episode": turns}
        (run / "eval" / when / "summary.json").write_text(json.dumps(eval_summary))
    return run


def test_held_out_rows_take_the_summarys_interval_or_wilsons(tmp_path: Path) -> None:
    run = finished_run(tmp_path)
    view = held_out_view(SUMMARY, run)
    assert view["tasks"] == 64
    base, before, after = view["rows"]
    assert (base["label"], before["label"], after["label"]) == (
        "base model", "after the warm start", "after RL",
    )  # fmt: skip
    assert base["ci"] == pytest.approx(wilson_interval(17, 64)) and base["source"] == "Wilson"
    assert before["ci"] == [0.615, 0.827] and before["source"] == "summary.json"
    assert (after["tool_calls_per_episode"], after["turns_per_episode"]) == (1.125, 2.5)
    rl = {c["key"]: c for c in view["changes"]}["rl_gain"]
    assert rl["ci_points"] == pytest.approx([-6.2, 6.2]) and rl["improved"] == 3
    assert rl["family_ci_points"] == pytest.approx([-12.5, 10.9]) and rl["families"] == 12
    both = {c["key"]: c for c in view["changes"]}["gain"]
    assert both["ci_points"] == pytest.approx([0.0, 0.8]) and both["family_ci_points"] is None
    # an interval in points, or as {low, high}; a run without a warm start; none measured
    held = {"before": {"success": 0.5, "episodes": 10, "ci": {"low": 20.0, "high": 80.0}}}
    row = held_out_view({"held_out": held}, run)["rows"][0]
    assert row["label"] == "before RL" and row["ci"] == pytest.approx([0.2, 0.8])
    assert held_out_view({"held_out": {"tasks": 0, "base": None}}, run)["rows"] == []
    assert held_out_view({}, run) == {"tasks": 0, "rows": [], "changes": []}
    # the page embeds it once the run has ended at its last recorded step
    data = embedded(render_report(run))
    assert data["held_out"]["rows"][1]["ci"] == [0.615, 0.827]
    assert data["startup"]["phases"]["imports_s"] == 6.4


def test_a_report_survives_any_text(tmp_path: Path) -> None:
    run = finished_run(tmp_path)
    bad = "lone \udcff surrogate \ud800 and </script><!--"
    with (run / "transcripts.jsonl").open("a") as f:  # json.dumps writes \\udcff escapes
        record = {"step": 6, "traj_id": bad, "task_id": bad, "reward": 0.0, "messages": [
            {"role": "assistant", "content": bad}], "info": {"outcome": bad}}  # fmt: skip
        f.write(json.dumps(record) + "\n")
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 7, "note": bad}) + "\n")
    (run / "config.yaml").write_bytes((run / "config.yaml").read_bytes() + b"x: \xff\xfe\n")
    summary = {**SUMMARY, "steps": 7, "stop_reason": bad}
    (run / "summary.json").write_text(json.dumps(summary))
    page = write_report(run).read_bytes().decode("utf-8")  # valid UTF-8
    data = embedded(page)
    assert data["summary"]["stop_reason"] == bad  # the same text, escaped on the way
    assert data["metrics"][-1]["note"] == bad
    assert "</script><!--" not in page.split('id="run-data">')[1].split("</script>")[0]


def test_the_startup_clock_starts_with_python_not_with_the_process(tmp_path: Path) -> None:
    """scripts/train.sh ``exec``s Python from the shell that ran the install: the process is
    as old as the install. The clock starts at Python's import of the package."""
    code = (
        "import time; time.sleep(0.2)\n"  # Python's own work before the package is not counted
        "from areal_agents.trainers.stop import StartupClock\n"
        "import json; print(json.dumps(StartupClock().summary()))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["bash", "-c", 'sleep 3; exec "$0" -c "$1"', sys.executable, code],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )  # fmt: skip
    imports_s = json.loads(done.stdout)["startup"]["imports_s"]
    assert 0 < imports_s < 3, imports_s  # the 3 s the shell spent before exec are not imports


@pytest.mark.browser
def test_the_page_shows_what_the_run_measured(tmp_path: Path) -> None:
    page = write_report(finished_run(tmp_path))
    browser = DevTools(tmp_path / "cdp")
    try:
        browser.open(page.as_uri() + "#refresh=0")
        cells = browser.js(
            "[...document.querySelectorAll('#heldout-table tr[data-when]')].map((tr) =>"
            " [tr.dataset.when, ...[...tr.cells].map((td) => td.textContent)])"
        )
        lo, hi = wilson_interval(17, 64)
        assert cells == [
            ["base", "base model", "26.6%", f"{100 * lo:.1f}% to {100 * hi:.1f}% (Wilson)", "64",
             "0.25", "1.2"],
            ["before", "after the warm start", "73.4%", "61.5% to 82.7% (summary.json)", "64",
             "1", "2"],
            ["after", "after RL", "73.4%", "61.5% to 82.7% (Wilson)", "64", "1.13", "2.5"],
        ]  # fmt: skip
        changes = browser.js("[...document.querySelectorAll('#heldout-changes li')]"
                             ".map((li) => li.textContent)")  # fmt: skip
        assert changes[1] == (
            "RL: +0.0 points (95% CI -6.2 to +6.2; by task family (12): -12.5 to +10.9; 3 "
            "fixed, 3 broken; McNemar p=1), paired on the same tasks"
        )
        assert changes[2].startswith("warm start + RL: +1.6 points (95% CI +0.0 to +0.8; 1 f")
        assert changes[0] == (
            "warm start: +46.9 points (95% CI +34.4 to +59.4; 31 fixed, 1 broken; McNemar "
            "p<0.001), paired on the same tasks"
        )
        startup = browser.js(
            "Object.fromEntries([...document.querySelectorAll('#startup-table tr')]"
            ".map((tr) => [tr.dataset.key, tr.cells[1].textContent]))"
        )
        assert startup == {
            "first-step": "95.25 s", "without-eval": "41.5 s", "imports_s": "6.4 s",
            "prepare_s": "1.2 s", "ray_s": "3.1 s", "first_train_s": "12 s",
        }  # fmt: skip
        points = dict(zip(
            browser.js("[...document.querySelectorAll('.chart')].map((e) => e.id)"),
            browser.js("[...document.querySelectorAll('.chart')].map((e) => +e.dataset.points)"),
            strict=True,
        ))  # fmt: skip
        assert points["chart-episodes"] == 12  # tool calls and turns at 6 steps
        assert points["chart-policy"] == 18  # update KL, behavior KL, approx KL
        assert points["chart-weights"] == 24  # q50, q90, q99, max
        assert points["chart-fractions"] == 24  # the four *_frac keys
        assert points["chart-heldout"] == 2
        titles = browser.js("[...document.querySelectorAll('.chart h3')].map((e) => e.textContent)")
        assert {"Policy movement (nats/token)", "Importance weights",
                "Clipped and masked fractions"} <= set(titles)  # fmt: skip
        legend = browser.js("document.getElementById('chart-fractions').textContent")
        assert all(k in legend for k in ("clip/high_frac", "correction/truncated_frac"))
    finally:
        browser.close()


@pytest.mark.browser
def test_a_run_without_the_new_metrics_keeps_its_charts_empty(tmp_path: Path) -> None:
    page = write_report(make_run(tmp_path, steps=3))  # an old run: none of the new keys
    browser = DevTools(tmp_path / "cdp")
    try:
        browser.open(page.as_uri() + "#refresh=0")
        empty = browser.js(
            "[...document.querySelectorAll('.chart')].filter((e) => e.dataset.points === '0')"
            ".map((e) => e.id)"
        )
        assert {"chart-policy", "chart-weights", "chart-fractions"} <= set(empty)
        assert browser.js("document.getElementById('heldout').textContent") == (
            "measured when the run ends"
        )
    finally:
        browser.close()


def test_wilson_is_what_the_page_computes_from_counts() -> None:
    lo, hi = wilson_interval(47, 64)
    assert math.isclose(lo, 0.615, abs_tol=1e-3) and math.isclose(hi, 0.827, abs_tol=1e-3)
