"""Per task family (generator template): what an RL run trained on, what it earned there, and
what happened to the family's held-out tasks.

The recipe's runs that lost held-out points lost them by one solved template collapsing
(``benchmarks/README.md`` section 12). Whether such a template was trained on, whether its
training groups carried a reward spread (GRPO learns only from those), and whether its training
reward fell too, are read here from the run's ``metrics.jsonl`` (``batch/task_ids`` and
``batch/group_rewards``, per group) and its held-out evaluations:

    python -m benchmarks.rl_families runs/rl_gain_norm/code_sandbox-seed0/norm_default_r4

One row per family: the training groups and how many had a spread, the mean training reward in
the run's first and second half of steps, and held-out solved before -> after (``--before``:
another evaluation directory; by default the run's ``eval/before`` or its seed's shared one).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from areal_agents.files import read_jsonl

__all__ = ["FamilyRow", "family_rows", "format_rows", "main"]


@dataclass
class FamilyRow:
    """One family's training record and held-out outcome in a run."""

    family: str
    groups: int = 0
    spread: int = 0  # groups whose episodes did not all earn the same reward
    first_half: list[float] = field(default_factory=list)  # training rewards, steps 1..n/2
    second_half: list[float] = field(default_factory=list)
    held_before: tuple[int, int] = (0, 0)  # (solved, tasks)
    held_after: tuple[int, int] = (0, 0)


def _family(task_id: str) -> str:
    from areal_agents.trainers.data import task_family

    return task_family(task_id) or task_id


def family_rows(run: Path, before: Path | None = None) -> list[FamilyRow]:
    """The rows of ``run`` (an output directory of ``areal_agents.train``), families trained on
    or held out, sorted by name. Raises ``ValueError`` for a run recorded before the per-group
    keys existed."""
    from areal_agents.trainers.held_out import task_families, task_successes
    from benchmarks.interpolate import before_dir

    lines = read_jsonl(run / "metrics.jsonl", torn_ok=True)
    if lines and "batch/task_ids" not in lines[0]:
        raise ValueError(f"{run}: metrics.jsonl has no batch/task_ids (a run from before them)")
    rows: dict[str, FamilyRow] = {}

    def row(family: str) -> FamilyRow:
        return rows.setdefault(family, FamilyRow(family))

    half = len(lines) / 2
    for i, line in enumerate(lines):
        for task_id, rewards in zip(
            line["batch/task_ids"], line["batch/group_rewards"], strict=True
        ):
            r = row(_family(str(task_id)))
            r.groups += 1
            r.spread += len(set(rewards)) > 1
            (r.first_half if i < half else r.second_half).extend(float(x) for x in rewards)
    before = before or before_dir(run)
    solved_before, solved_after = task_successes(before), task_successes(run / "eval" / "after")
    families = task_families(before) or task_families(run / "eval" / "after")
    indices: dict[str, list[int]] = defaultdict(list)
    for index, family in families.items():
        indices[family].append(index)

    def count(solved: dict[int, bool] | None, tasks: list[int]) -> tuple[int, int]:
        scored = [solved[i] for i in tasks if solved is not None and i in solved]
        return sum(scored), len(scored)

    for family, tasks in indices.items():
        r = row(family)
        r.held_before, r.held_after = count(solved_before, tasks), count(solved_after, tasks)
    return [rows[k] for k in sorted(rows)]


def format_rows(rows: Sequence[FamilyRow]) -> str:
    """The table ``main`` prints."""

    def num(values: list[float]) -> str:
        return f"{statistics.fmean(values):.2f}" if values else "-"

    out = [
        f"{'family':32} {'groups':>6} {'spread':>6} {'reward 1st':>10} {'2nd half':>8} "
        f"{'held-out before -> after':>24}"
    ]
    for r in rows:
        sides = [f"{s}/{n}" if n else "-" for s, n in (r.held_before, r.held_after)]
        held = f"{sides[0]} -> {sides[1]}" if r.held_before[1] or r.held_after[1] else "-"
        out.append(
            f"{r.family:32} {r.groups:6d} {r.spread:6d} {num(r.first_half):>10} "
            f"{num(r.second_half):>8} {held:>24}"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the run's output directory")
    parser.add_argument("--before", type=Path, help="the evaluation before RL (default: found)")
    args = parser.parse_args(argv)
    try:
        rows = family_rows(args.run, args.before)
    except ValueError as error:
        raise SystemExit(str(error)) from error
    print(format_rows(rows))


if __name__ == "__main__":
    main()
