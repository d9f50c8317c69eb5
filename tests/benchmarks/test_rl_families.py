"""benchmarks/rl_families: a run's training groups and held-out outcomes, per template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.rl_families import family_rows, format_rows, main


def _jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _eval(path: Path, outcomes: dict[int, tuple[str, float]]) -> None:
    rows = [{"task_index": i, "task_id": t, "reward": r} for i, (t, r) in outcomes.items()]
    _jsonl(path / "transcripts.jsonl", rows)


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "code_sandbox-seed0" / "variant"
    steps = [  # four steps: fibonacci solved throughout early, then failing; count_words learnt
        (["gen/fibonacci/1", "gen/count_words/2"], [[1.0, 1.0], [0.0, 1.0]]),
        (["gen/fibonacci/3", "gen/count_words/4"], [[1.0, 1.0], [0.0, 0.0]]),
        (["gen/fibonacci/5"], [[0.0, 1.0]]),
        (["gen/fibonacci/6", "gen/count_words/8"], [[0.0, 0.0], [1.0, 1.0]]),
    ]
    _jsonl(
        run / "metrics.jsonl",
        [
            {"step": s + 1, "batch/task_ids": t, "batch/group_rewards": r}
            for s, (t, r) in enumerate(steps)
        ],
    )
    held = {0: "gen/fibonacci/90", 1: "gen/fibonacci/91", 2: "gen/count_words/92"}
    _eval(
        tmp_path / "code_sandbox-seed0" / "before",
        {i: (held[i], r) for i, r in [(0, 1.0), (1, 1.0), (2, 0.0)]},
    )
    _eval(run / "eval" / "after", {i: (held[i], r) for i, r in [(0, 0.0), (1, 0.0), (2, 1.0)]})
    return run


def test_each_family_s_groups_spread_halves_and_held_out_tasks(tmp_path: Path) -> None:
    rows = {r.family: r for r in family_rows(_run(tmp_path))}
    fib, words = rows["gen/fibonacci"], rows["gen/count_words"]
    assert (fib.groups, fib.spread) == (4, 1)
    assert fib.first_half == [1.0, 1.0, 1.0, 1.0] and fib.second_half == [0.0, 1.0, 0.0, 0.0]
    assert fib.held_before == (2, 2) and fib.held_after == (0, 2)
    assert (words.groups, words.spread) == (3, 1)
    assert words.second_half == [1.0, 1.0]
    assert words.held_before == (0, 1) and words.held_after == (1, 1)


def test_the_run_s_own_before_is_read_first_and_before_can_be_named(tmp_path: Path) -> None:
    run = _run(tmp_path)
    own = {
        0: ("gen/fibonacci/90", 0.0),
        1: ("gen/fibonacci/91", 0.0),
        2: ("gen/count_words/92", 1.0),
    }
    _eval(run / "eval" / "before", own)
    assert {r.family: r.held_before for r in family_rows(run)}["gen/fibonacci"] == (0, 2)
    shared = tmp_path / "code_sandbox-seed0" / "before"
    assert {r.family: r.held_before for r in family_rows(run, shared)}["gen/fibonacci"] == (2, 2)


def test_the_table_shows_every_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = family_rows(_run(tmp_path))
    text = format_rows(rows)
    assert "2/2 -> 0/2" in text and "0/1 -> 1/1" in text
    main([str(_run(tmp_path))])
    assert capsys.readouterr().out.strip() == text


def test_a_run_from_before_the_per_group_keys_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "old"
    _jsonl(run / "metrics.jsonl", [{"step": 1, "batch/task_indices": [0]}])
    with pytest.raises(SystemExit, match="batch/task_ids"):
        main([str(run)])


def test_a_side_not_yet_scored_shows_as_a_dash(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "eval" / "after" / "transcripts.jsonl").unlink()  # the run still training
    text = format_rows(family_rows(run))
    assert "2/2 -> -" in text and "0/2" not in text
