"""What the RL phase alone does to held-out success: one warm start per seed, then RL variants
from it, each scored on the same held-out tasks before and after, paired.

The main command spends part of its budget on a supervised warm start and the rest on RL. To
compare RL recipes (a trust region, a learning rate, the placebo), this runs the warm start once
per seed (exactly the main command's: ``trainers/warm_start.py``, the same demonstrations and
held-out exclusions), scores the warm-started model once, and then runs each variant as the
main command would run its RL phase: ``python -m areal_agents.train model=<warm start>
warm_start.steps=0 trainer.time_budget_s=<1200 - the warm start's training time>`` plus the
variant's overrides. Each variant's held-out success after RL is paired with the shared "before"
(McNemar, paired bootstrap: ``areal_agents/stats.py``).

    python -m benchmarks.rl_gain warm --seeds 0,1,2
    python -m benchmarks.rl_gain run --seeds 0,1,2 --name default
    python -m benchmarks.rl_gain run --seeds 0,1,2 --name placebo algo.shuffle_rewards=true
    python -m benchmarks.rl_gain table      # one row per run
    python -m benchmarks.rl_gain variants   # one row per variant, over its seeds
    python -m benchmarks.rl_gain rescore    # recompute every stored comparison from its runs
    python -m benchmarks.rl_gain compare --seeds 0,1,2 --name default --against placebo
    python -m benchmarks.rl_gain compare --seeds 0,1,2 --name default,default_r2  # repeats

The held-out code tasks come in families (the 24 templates, 2-10 tasks each, and a greedy
policy tends to solve a template's tasks all or none), so beside the task-level interval every
comparison carries the interval that resamples whole families (``family_ci95_points``), the
honest one for a claim about the recipe. The tables also show the policy's total movement, the
sum of the per-step probe KLs (``policy/update_kl``): a gain per unit of movement tells signal
from drift better than either alone.

``compare`` pairs two variants' held-out outcomes after RL task by task (RL against its placebo
or its supervised control; ``--against before`` is the warm start), per seed and pooled over the
seeds (each seed's families resampled as clusters), split like the runs where the warm start
left families out. A comma-separated ``--name`` is repeats of one variant (the same overrides
run again under new names, from the same warm starts): they are pooled per seed and over the
seeds, a family's tasks of every repeat resampled together.

Results: ``<root>/<env>-seed<S>/<name>/`` (the run) and ``benchmarks/results/rl_gain.json``
(one entry per env, seed, variant and root, replaced when re-run; the same variant name
under two roots is two entries, and ``rescore --root`` touches only that root's). Each entry
keeps its held-out outcomes task by task (``tasks``), so that ``compare`` pools runs whose
directories are gone with their machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_agents.files import read_json, read_jsonl, write_json

__all__ = [
    "by_variant",
    "compare",
    "main",
    "paired",
    "rescore",
    "root_of",
    "run_variant",
    "table",
    "task_record",
    "warm",
]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "rl_gain.json"
BUDGET_S = 1200.0  # the main command's trainer.time_budget_s, the warm start's included


def _seed_dir(root: Path, env: str, seed: int) -> Path:
    return root / f"{env}-seed{seed}"


def warm(env: str, seed: int, root: Path, held_out: int, extra: Sequence[str]) -> dict[str, Any]:
    """The main command's warm start for ``seed`` into ``<seed dir>/warm_start`` (kept)."""
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig
    from areal_agents.trainers.held_out import held_out_task_ids
    from areal_agents.trainers.modeling import prepare_model_dir
    from areal_agents.trainers.warm_start import run_warm_start

    out = _seed_dir(root, env, seed)
    out.mkdir(parents=True, exist_ok=True)
    overrides = [f"env={env}", f"trainer.seed={seed}", f"eval.held_out_tasks={held_out}", *extra]
    cfg = load_config(TrainConfig, overrides)
    model_dir = prepare_model_dir(cfg.model, out)
    info = run_warm_start(cfg, model_dir, out, held_out_task_ids(cfg))
    if info is None:
        raise SystemExit(f"{env} has no demonstrations: nothing to warm-start")
    return info


def _undemonstrated(seed_dir: Path) -> list[str]:
    """The task families the seed's warm start never demonstrated
    (``warm_start.exclude_families``)."""
    path = seed_dir / "warm_start.json"
    return list(read_json(path).get("exclude_families") or []) if path.is_file() else []


def paired(
    before_dir: Path, after_dir: Path, undemonstrated: Sequence[str] = ()
) -> dict[str, Any] | None:
    """The paired change from the evaluation in ``before_dir`` to the one in ``after_dir`` (None
    if either has no outcomes), and where the warm start left ``undemonstrated`` families out,
    the change on those families' tasks and on the rest (``rl_gain_undemonstrated``,
    ``rl_gain_demonstrated``)."""
    from areal_agents.stats import compare_paired
    from areal_agents.trainers.held_out import demonstration_split, task_families, task_successes

    before = task_successes(before_dir)
    after = task_successes(after_dir)
    if not before or not after:
        return None
    families = task_families(before_dir)
    out = compare_paired(before, after, families=families).to_json()
    if undemonstrated:
        out.update(demonstration_split(before, after, families, undemonstrated))
    return out


def _paired(seed_dir: Path, run_dir: Path, when: str = "after") -> dict[str, Any] | None:
    """:func:`paired` for a variant's run (its final policy, or ``when="last"``: the last
    step's, scored where validation chose another) against its seed's shared "before"; None
    where the run has no such measurement."""
    return paired(seed_dir / "before", run_dir / "eval" / when, _undemonstrated(seed_dir))


def run_variant(
    env: str, seed: int, root: Path, name: str, overrides: Sequence[str], held_out: int
) -> dict[str, Any]:
    """One RL variant from the seed's warm start; its figures (and the run in ``<seed>/name``)."""
    seed_dir = _seed_dir(root, env, seed)
    info = read_json(seed_dir / "warm_start.json")
    run_dir = seed_dir / name
    shared_before = seed_dir / "before"
    command = [
        sys.executable,
        "-m",
        "areal_agents.train",
        f"env={env}",
        f"trainer.seed={seed}",
        f"model={seed_dir / 'warm_start'}",
        "warm_start.steps=0",
        f"eval.held_out_tasks={held_out}",
        f"eval.before={str(not shared_before.is_dir()).lower()}",
        f"trainer.time_budget_s={BUDGET_S - float(info['train_s']):.0f}",
        f"output_dir={run_dir}",
        "log.progress=false",
        *overrides,
    ]
    undemonstrated = _undemonstrated(seed_dir)
    if undemonstrated:  # the replay (and the run's report) keep the warm start's split
        command.append(f"warm_start.exclude_families=[{','.join(undemonstrated)}]")
    start = time.time()
    load_start = os.getloadavg()[0]
    subprocess.run(command, cwd=ROOT, check=True)
    if not shared_before.is_dir():  # the first variant scored the warm start: share it
        shutil.copytree(run_dir / "eval" / "before", shared_before)
    summary = read_json(run_dir / "summary.json")
    rows = read_jsonl(run_dir / "metrics.jsonl", torn_ok=True)

    def curve(key: str) -> list[float | None]:
        # four significant digits: a probe KL of 7e-6 must not round to 1e-5
        return [None if r.get(key) is None else float(f"{float(r[key]):.4g}") for r in rows]

    return {
        "env": env,
        "seed": seed,
        "name": name,
        "root": str(root),
        "overrides": list(overrides),
        "command": " ".join(command[1:]),
        "warm_start_train_s": info["train_s"],
        "steps": summary.get("steps"),
        "stop_reason": summary.get("stop_reason"),
        "training_s": summary.get("training_s"),
        "held_out": _paired(seed_dir, run_dir),
        # the final policy chosen on validation tasks, and what RL's last step scored where
        # another was chosen (areal_agents/trainers/selection.py)
        "selection": (summary.get("held_out") or {}).get("selection"),
        "held_out_last": _paired(seed_dir, run_dir, "last"),
        "tasks": task_record(seed_dir, run_dir),
        "reward": curve("reward/mean"),
        "update_kl": curve("policy/update_kl"),
        "behavior_kl": curve("behavior/kl"),
        "entropy": curve("entropy"),
        "lr": curve("lr"),
        "clip_frac": curve("clip/frac"),
        "wall_s": round(time.time() - start, 1),
        "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]},
    }


def root_of(entry: Mapping[str, Any]) -> Path | None:
    """The ``--root`` an entry's runs are under: its ``root``, or for an entry stored before
    that field, two levels above the ``output_dir`` its command names
    (``<root>/<env>-seed<S>/<name>``); None when neither says.

    >>> root_of({"command": "-m areal_agents.train output_dir=runs/x/code_sandbox-seed0/v"})
    PosixPath('runs/x')
    """
    if entry.get("root"):
        return Path(str(entry["root"]))
    found = re.search(r"(?:^|\s)output_dir=(\S+)", str(entry.get("command", "")))
    return Path(found.group(1)).parent.parent if found else None


def _key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    """What one stored result is of: the same variant name under two roots is two results."""
    return (entry["env"], entry["seed"], entry["name"], root_of(entry))


def _store(entry: dict[str, Any]) -> None:
    entries = list(read_json(RESULTS)) if RESULTS.is_file() else []
    entries = [e for e in entries if _key(e) != _key(entry)] + [entry]
    entries.sort(key=lambda e: (e["env"], e["name"], e["seed"]))
    write_json(RESULTS, entries)


def _family_ci(held_out: dict[str, Any]) -> str:
    """``-1.6 to +18.8 (24)``: the interval by task family and the number of families."""
    ci = held_out.get("family_ci95_points")
    return "-" if ci is None else f"{ci[0]:+.1f} to {ci[1]:+.1f} ({held_out.get('families')})"


def _cells(c: dict[str, Any]) -> str:
    """A paired comparison's cells from its fields (as :meth:`PairedComparison.to_json` names
    them): before, after, the gain with its interval, the interval by family, fixed / broken,
    McNemar's p."""
    lo, hi = c["ci95_points"]
    return (
        f"{100 * c['before']:.1f}% | {100 * c['after']:.1f}% | **{c['gain_points']:+.1f}** "
        f"({lo:+.1f} to {hi:+.1f}) | {_family_ci(c)} | {c['improved']} / {c['regressed']} | "
        f"{c['mcnemar_p']:.3g}"
    )


def table(entries: Sequence[dict[str, Any]]) -> str:
    """A markdown table: one row per env, variant and seed (and, for a warm start that left
    families out, a row each for the held-out tasks of those families and of the rest; where
    validation chose a final policy before the last step, its step in the steps cell and a row
    for the last step's own weights)."""
    from areal_agents.trainers.held_out import DEMONSTRATION_SIDES

    lines = [
        "| env | variant | seed | before | after | RL gain (95% CI) | CI by family (families) "
        "| fixed / broken | McNemar p | steps | update KL (sum / max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        h = e.get("held_out") or {}
        if not h:
            continue
        kls = [k for k in e.get("update_kl") or [] if k is not None]
        kl = f"{sum(kls):.1e} / {max(kls):.1e}" if kls else "-"
        parts = [("", h)] + [
            (f" ({side})", h[f"rl_gain_{side}"])
            for side, _ in DEMONSTRATION_SIDES
            if h.get(f"rl_gain_{side}")
        ]
        if e.get("held_out_last"):
            parts.append((" (last step)", e["held_out_last"]))
        chosen = (e.get("selection") or {}).get("chosen_step")
        steps = (
            f"{e['steps']} (final: {chosen})" if chosen not in (None, e["steps"]) else e["steps"]
        )
        for suffix, c in parts:
            lines.append(
                f"| {e['env']} | {e['name']}{suffix} | {e['seed']} | {_cells(c)} | {steps} | {kl} |"
            )
    return "\n".join(lines)


def task_record(seed_dir: Path, run_dir: Path) -> dict[str, Any]:
    """What :func:`compare` needs of a run, stored in its entry (``tasks``) so that its runs can
    be pooled after their directories are gone: per held-out task index, solved before and
    after RL (1 or 0) and its family, and the families the warm start left out."""
    from areal_agents.trainers.held_out import task_families, task_successes

    def bits(solved: Mapping[int, bool] | None) -> dict[str, int]:
        return {str(i): int(v) for i, v in sorted((solved or {}).items())}

    return {
        "before": bits(task_successes(seed_dir / "before")),
        "after": bits(task_successes(run_dir / "eval" / "after")),
        "last": bits(task_successes(run_dir / "eval" / "last")),
        "families": {str(i): f for i, f in sorted(task_families(seed_dir / "before").items())},
        "undemonstrated": _undemonstrated(seed_dir),
    }


def _stored(stored: Sequence[Mapping[str, Any]], seed_dir: Path, name: str) -> dict[str, Any]:
    """The ``tasks`` record of the stored entry for ``name`` under ``seed_dir`` (``before``: any
    of the seed's entries that has one); empty if none."""
    root, env_seed = seed_dir.parent, seed_dir.name
    for e in stored:
        same = f"{e['env']}-seed{e['seed']}" == env_seed and root_of(e) == root
        if same and e.get("tasks") and name in (e["name"], "before"):
            return dict(e["tasks"])
    return {}


def _outcomes(
    seed_dir: Path, name: str, stored: Sequence[Mapping[str, Any]] = ()
) -> dict[int, bool]:
    """A variant's held-out successes after RL (``before``: the warm start's), from its run's
    transcripts or, where the run is gone, from its stored entry; empty if neither has them."""
    from areal_agents.trainers.held_out import task_successes

    where = seed_dir / "before" if name == "before" else seed_dir / name / "eval" / "after"
    found = task_successes(where)
    if found:
        return dict(found)
    record = _stored(stored, seed_dir, name).get("before" if name == "before" else "after")
    return {int(i): bool(v) for i, v in (record or {}).items()}


def compare(
    env: str,
    seeds: Sequence[int],
    root: Path,
    name: str,
    against: str,
    stored: Sequence[Mapping[str, Any]] = (),
) -> str:
    """A markdown table: ``name``'s held-out outcomes paired with ``against``'s on the same
    tasks, per seed and pooled over the seeds, with a row each for the families the warm start
    never demonstrated and for the rest where it left some out. A seed where either variant has
    no held-out result is skipped.

    ``name`` may list repeats of one variant, comma-separated (``default,default_r2``: the same
    overrides run again from the same warm start): each repeat's tasks are paired with
    ``against``'s, and a seed's row pools its repeats, each family's tasks of every repeat
    resampled together (a run that flips a template flips it for all its tasks; another run of
    the same seed is a second draw of the same template), so the interval is over the recipe
    and not one run of it. A run whose directory is gone is read from its entry in ``stored``
    (``results/rl_gain.json``: :func:`task_record`)."""
    from areal_agents.stats import PairedComparison, compare_paired
    from areal_agents.trainers.held_out import demonstration_sides, task_families

    names = [n for n in name.split(",") if n]
    if not names:
        raise ValueError("compare: --name names no variant")
    lines = [
        f"| env | {name} against {against} | seed | tasks | {against} | {name} | change (95% CI) "
        "| CI by family (families) | fixed / broken | McNemar p |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    pooled: dict[str, tuple[dict[Any, bool], dict[Any, bool]]] = {}
    clusters: dict[Any, Any] = {}

    def row(seed: str, tasks: str, c: PairedComparison) -> None:
        cells = _cells(dataclasses.asdict(c))  # unrounded: to_json keeps 4 places of p
        lines.append(f"| {env} | {name} against {against} | {seed} | {tasks} | {cells} |")

    for seed in seeds:
        seed_dir = _seed_dir(root, env, seed)
        base = _outcomes(seed_dir, against, stored)
        runs = {n: o for n in names if (o := _outcomes(seed_dir, n, stored))}
        if not base or not runs:
            continue
        record = _stored(stored, seed_dir, next(iter(runs)))
        families = task_families(seed_dir / "before") or {
            int(i): f for i, f in (record.get("families") or {}).items()
        }
        undemonstrated = _undemonstrated(seed_dir) or list(record.get("undemonstrated") or [])
        common = set(base).intersection(*runs.values())
        sides = {"all": common}
        if undemonstrated:
            sides.update(demonstration_sides(common, families, undemonstrated))
        for side, tasks in sides.items():
            if not tasks:
                continue
            b = {(n, t): base[t] for n in runs for t in tasks}
            a = {(n, t): other[t] for n, other in runs.items() for t in tasks}
            fam = {(n, t): families.get(t, t) for n in runs for t in tasks}
            row(str(seed), side, compare_paired(b, a, families=fam))
            pb, pa = pooled.setdefault(side, ({}, {}))
            for key in b:
                pb[(seed, *key)], pa[(seed, *key)] = b[key], a[key]
                clusters[(seed, *key)] = (seed, fam[key])
    for side, (pb, pa) in pooled.items():
        row("pooled", side, compare_paired(pb, pa, families=clusters))
    return "\n".join(lines)


def rescore(entries: Sequence[dict[str, Any]], root: Path) -> list[dict[str, Any]]:
    """``entries`` with each held-out comparison recomputed from its runs' transcripts under
    ``root`` (an entry of another root, or whose runs are not there, is kept as it was)."""
    out = []
    for e in entries:
        if root_of(e) not in (None, root):  # the same name under another root: not this run
            out.append(dict(e))
            continue
        seed_dir = _seed_dir(root, e["env"], int(e["seed"]))
        run_dir = seed_dir / e["name"]
        paired = _paired(seed_dir, run_dir)
        if paired:
            last = _paired(seed_dir, run_dir, "last")
            record = task_record(seed_dir, run_dir)
            out.append({**e, "held_out": paired, "held_out_last": last, "tasks": record})
        else:
            out.append(dict(e))
    return out


def by_variant(entries: Sequence[dict[str, Any]]) -> str:
    """A markdown table: one row per env and variant, over its seeds: each seed's RL gain, their
    mean and smallest, the tasks fixed and broken in all, and the mean update KL."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in entries:
        if e.get("held_out"):
            groups.setdefault((e["env"], e["name"]), []).append(e)
    lines = [
        "| env | variant | seeds | RL gain per seed (points) | mean | min | fixed / broken "
        "| update KL (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (env, name), runs in sorted(groups.items()):
        runs = sorted(runs, key=lambda e: e["seed"])
        gains = [float(e["held_out"]["gain_points"]) for e in runs]
        fixed = sum(int(e["held_out"]["improved"]) for e in runs)
        broken = sum(int(e["held_out"]["regressed"]) for e in runs)
        kls = [k for e in runs for k in e.get("update_kl") or [] if k is not None]
        kl = f"{sum(kls) / len(kls):.2e}" if kls else "-"
        seeds = ",".join(str(e["seed"]) for e in runs)
        per_seed = ", ".join(f"{g:+.1f}" for g in gains)
        lines.append(
            f"| {env} | {name} | {seeds} | {per_seed} | **{sum(gains) / len(gains):+.1f}** "
            f"| {min(gains):+.1f} | {fixed} / {broken} | {kl} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "action", choices=("warm", "run", "table", "variants", "rescore", "compare")
    )
    parser.add_argument("--env", default="code_sandbox")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--root", default="runs/rl_gain")
    parser.add_argument("--name", default="default", help="the variant's name (run)")
    parser.add_argument("--held-out", type=int, default=128)
    parser.add_argument(
        "--against", default="before", help="the variant --name is paired with (compare)"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides of the variant (run)")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    root, seeds = Path(args.root), [int(s) for s in args.seeds.split(",")]
    if args.action in ("table", "variants"):
        entries = read_json(RESULTS) if RESULTS.is_file() else []
        print(table(entries) if args.action == "table" else by_variant(entries))
        return
    if args.action == "compare":
        stored = read_json(RESULTS) if RESULTS.is_file() else []
        print(compare(args.env, seeds, root, args.name, args.against, stored))
        return
    if args.action == "rescore":
        entries = rescore(read_json(RESULTS) if RESULTS.is_file() else [], root)
        write_json(RESULTS, entries)
        print(table(entries))
        return
    for seed in seeds:
        if args.action == "warm":
            info = warm(args.env, seed, root, args.held_out, args.overrides)
            print(f"{args.env} seed {seed}: warm start {info['train_s']} s")
            continue
        entry = run_variant(args.env, seed, root, args.name, args.overrides, args.held_out)
        _store(entry)
        print(table([entry]))


if __name__ == "__main__":
    main()
