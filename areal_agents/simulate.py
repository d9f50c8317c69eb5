"""``python -m areal_agents.simulate``: sync against async before you rent a cluster.

Simulates the trainer's scheduling (its own buffer: admission, staleness bound, batch order) on
a machine described by a profile, for sync and for async at each staleness bound asked, and
prints trained tokens/s, samples/s, idle fractions and staleness::

    python -m areal_agents.simulate --profile gpu_h100_vllm_8b --servers 8 --learners 8 \\
        --groups-per-step 64 --group-size 8 --staleness 1,2,4,8 --steps 20

``--profile`` takes a shipped profile's name (``--list`` prints them) or a YAML/JSON file;
``--from-run runs/NAME`` replaces its learner time, push time and tokens per turn with what
that run's ``metrics.jsonl`` measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from areal_agents.simulation import (
    Profile,
    SimConfig,
    available_profiles,
    load_profile,
    profile_from_run,
    simulate,
)

__all__ = ["main", "run_table", "sim_config", "table_lines"]


def run_table(
    profile: str | Profile,
    base: SimConfig,
    staleness: Sequence[int],
    sync_profile: str | Profile | None = None,
) -> list[dict[str, Any]]:
    """Sync, then async at each bound in ``staleness`` on ``profile`` (a name, a file or a
    :class:`Profile`); sync on ``sync_profile`` when given (its own placement of the same
    machine: every core for the server, then for the learner); one row per setting."""
    if not isinstance(profile, Profile):
        profile = load_profile(profile)
    if sync_profile is not None and not isinstance(sync_profile, Profile):
        sync_profile = load_profile(sync_profile)
    rows: list[dict[str, Any]] = []
    settings = [("sync", 0)] + [("async", s) for s in staleness]
    sync_tps = 0.0
    for mode, eta in settings:
        cfg = SimConfig(**{**base.__dict__, "mode": mode, "max_staleness": eta})
        res = simulate(sync_profile or profile if mode == "sync" else profile, cfg)
        if mode == "sync":
            sync_tps = res.tokens_per_s
        row = {"setting": "sync" if mode == "sync" else f"async s={eta}", **res.to_dict()}
        row["vs_sync"] = round(res.tokens_per_s / sync_tps, 3) if sync_tps else 0.0
        rows.append(row)
    return rows


def table_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The rows of :func:`run_table` as a text table, its header first."""
    lines = [
        f"{'setting':<11} {'tok/s':>10} {'samples/s':>10} {'vs sync':>8} {'gen idle':>9} "
        f"{'learn idle':>10} {'stale mean/max':>15} {'wall s':>10}"
    ]
    for r in rows:
        lines.append(
            f"{r['setting']:<11} {r['tokens_per_s']:>10.2f} {r['samples_per_s']:>10.4f} "
            f"{r['vs_sync']:>7.2f}x {100 * r['generation_idle_frac']:>8.1f}% "
            f"{100 * r['learner_idle_frac']:>9.1f}% "
            f"{r['staleness_mean']:>9.2f} / {r['staleness_max']:<3} {r['elapsed_s']:>10.1f}"
        )
    return lines


def sim_config(args: argparse.Namespace, **overrides: Any) -> SimConfig:
    """A :class:`SimConfig` from the parsed arguments named as its fields, then ``overrides``.

    >>> sim_config(argparse.Namespace(servers=4, steps=3, json=None), mode="sync").servers
    4
    """
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(SimConfig)
        if hasattr(args, f.name)
    }
    return SimConfig(**{**given, **overrides})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m areal_agents.simulate", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--profile", default="cpu_2core_builtin", help="a shipped name or a file")
    p.add_argument(
        "--sync-profile",
        default=None,
        help="the profile sync runs on (its placement of the machine); default: --profile",
    )
    p.add_argument(
        "--no-overlap-push",
        dest="overlap_push",
        action="store_false",
        help="each step waits for its weight push (trainer.overlap_weight_push=false)",
    )
    p.add_argument("--list", action="store_true", help="print the shipped profiles and exit")
    p.add_argument(
        "--from-run",
        default=None,
        help="a run directory: its metrics.jsonl replaces the profile's learner time, push "
        "time and tokens per turn",
    )
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--learners", type=int, default=1)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--concurrent-groups", type=int, default=None)
    p.add_argument("--staleness", default="1,2,4", help="async bounds to try, comma-separated")
    p.add_argument("--batch-order", choices=["ready", "admission"], default="ready")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        print("\n".join(available_profiles()))
        return 0
    base = sim_config(args)
    staleness = [int(s) for s in str(args.staleness).split(",") if s.strip()]
    profile = load_profile(args.profile)
    if args.from_run:
        profile = profile_from_run(args.from_run, profile)
    sync_profile = load_profile(args.sync_profile) if args.sync_profile else None
    rows = run_table(profile, base, staleness, sync_profile)
    where = f" (sync on {sync_profile.name})" if sync_profile else ""
    print(
        f"profile {profile.name}{where}: {args.servers} server(s), {args.learners} learner(s), "
        f"{args.groups_per_step} groups x {args.group_size} per step, {args.steps} steps"
    )
    print("\n".join(table_lines(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": profile.name, "config": vars(args), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
