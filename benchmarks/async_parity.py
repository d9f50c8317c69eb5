"""Held-out parity of async training with sync, per off-policy correction: the table of issue 29.

Reads the JSON files that ``benchmarks/async_vs_sync.py --json`` wrote, one cell (a loss and a
correction at one staleness bound) per call, and pairs every async run with the sync run of the
same seed on the same held-out tasks (``<run>/eval/after/transcripts.jsonl``): async minus sync
in points with a paired-bootstrap 95% interval and McNemar's p (``areal_agents/stats.py``).
Beside it, the price and the effect of the correction, from the run's ``metrics.jsonl``: trained
tokens/s, the staleness the trained tokens really had (token-weighted mean, max), the fraction
of tokens the correction masked or truncated, and the behaviour KL.

    python -m benchmarks.async_parity benchmarks/results/parity/*.json \\
        --json benchmarks/results/async_parity.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, write_json

__all__ = ["cell_label", "main", "parity_rows"]

#: The overrides that name a cell's correction (the rest are shared by every cell).
CORRECTION_PREFIXES = ("algo.behavior_imp_", "trainer.batch_order=")


def cell_label(args: dict[str, Any], mode: str) -> str:
    """``sync [lr=1e-05]``, or ``async_s4 decoupled_ppo [mode=mask, lr=2e-05]``: the mode, the
    loss, the correction (and the learning rate, where the benchmark's arguments name one)."""
    if mode == "sync":
        return "sync" + (f" [lr={args['lr']:g}]" if "lr" in args else "")
    loss, knobs = str(args.get("loss", "auto")), []
    for x in map(str, args.get("extra") or ()):
        if x.startswith("algo.loss="):  # an override of --loss (the last one wins, as in Hydra)
            loss = x.split("=", 1)[1]
        elif x.startswith(CORRECTION_PREFIXES):
            knobs.append(x.removeprefix("algo.behavior_imp_").removeprefix("trainer."))
    if "lr" in args:
        knobs.append(f"lr={args['lr']:g}")
    return f"{mode} {loss}" + (f" [{', '.join(knobs)}]" if knobs else " [defaults]")


def _metrics(run_dir: Path) -> dict[str, Any]:
    from areal_agents.files import read_jsonl

    path = run_dir / "metrics.jsonl"
    rows = read_jsonl(path, torn_ok=True) if path.is_file() else []
    if not rows:
        return {}
    tokens = [float(r.get("tokens/policy", 0.0)) for r in rows]
    total = sum(tokens) or 1.0

    def mean(key: str) -> float | None:
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        return round(statistics.fmean(values), 5) if values else None

    token_stale = sum(
        float(r.get("staleness/token_mean", 0.0)) * t for r, t in zip(rows, tokens, strict=True)
    )
    by_turns: dict[int, list[float]] = {}  # turns -> [staleness x episodes, episodes]
    for r in rows:
        for key, value in r.items():
            if key.startswith("staleness/turns") and key.endswith("_mean"):
                n = int(key.removeprefix("staleness/turns").removesuffix("_mean"))
                episodes = float(r.get(f"batch/turns{n}_episodes", 0))
                got = by_turns.setdefault(n, [0.0, 0.0])
                got[0], got[1] = got[0] + float(value) * episodes, got[1] + episodes

    def staleness_of(turns: range) -> float | None:
        picked = [v for n, v in by_turns.items() if n in turns and v[1]]
        episodes = sum(v[1] for v in picked)
        return round(sum(v[0] for v in picked) / episodes, 2) if episodes else None

    return {
        # whether the batch order trains long dialogues staler than short ones (issue 29 item 2)
        "staleness_short_episodes": staleness_of(range(1, 3)),  # 1-2 turns
        "staleness_long_episodes": staleness_of(range(8, 10**6)),  # 8 turns or more
        "staleness_token_mean": round(token_stale / total, 3),
        "staleness_token_max": max(int(float(r.get("staleness/token_max", 0))) for r in rows),
        "masked_frac": mean("behavior/masked_frac"),
        "truncated_frac": mean("behavior/truncated_frac"),
        "behavior_kl_mean": mean("behavior/kl"),
        "behavior_kl_max": max(
            (float(r["behavior/kl"]) for r in rows if "behavior/kl" in r), default=None
        ),
    }


def parity_rows(results: Sequence[dict[str, Any]], root: Path = REPO) -> list[dict[str, Any]]:
    """One row per run of ``results`` (async_vs_sync JSONs), paired with its seed's sync run."""
    from areal_agents.stats import compare_paired
    from areal_agents.trainers.held_out import task_families, task_successes

    runs = []
    for result in results:
        args = result.get("args") or {}
        for r in result.get("runs") or ():
            run_dir = root / str(args.get("out", "")) / str(r["setting"])
            key = (int(r["seed"]), args.get("lr"))  # a cell is paired with sync at its own lr
            runs.append((cell_label(args, str(r["mode"])), r, run_dir, key))
    sync = {key: d for label, r, d, key in runs if r["mode"] == "sync"}
    rows = []
    for label, r, run_dir, key in runs:
        solved = task_successes(run_dir / "eval" / "after")
        row: dict[str, Any] = {
            "cell": label,
            "seed": int(r["seed"]),
            "staleness_bound": int(r.get("staleness_bound", 0)),
            "held_out": (r.get("held_out") or {}).get("success_after"),
            "tokens_per_s": r.get("tokens_per_s"),
            "run_dir": str(run_dir),  # write_json makes it relative to the checkout
            **_metrics(run_dir),
        }
        base = sync.get(key)
        if r["mode"] != "sync" and base is not None and solved:
            reference = task_successes(base / "eval" / "after")
            if reference:
                families = task_families(base / "eval" / "after")
                row["vs_sync"] = compare_paired(reference, solved, families=families).to_json()
        rows.append(row)
    return sorted(rows, key=lambda x: (x["seed"], x["staleness_bound"], x["cell"]))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| seed | cell (run directory) | held-out | vs sync (95% CI), fixed/broken, p "
        "| trained tok/s | token staleness mean / max | staleness of 1-2 / 8+ turn episodes "
        "| masked | truncated | behaviour KL mean / max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        held = _fmt(None if x["held_out"] is None else 100 * x["held_out"], ".1f")
        vs = x.get("vs_sync")
        paired = "-" if vs is None else (
            f"{vs['gain_points']:+.1f} ({vs['ci95_points'][0]:+.1f}, {vs['ci95_points'][1]:+.1f}),"
            f" {vs['improved']}/{vs['regressed']}, {vs['mcnemar_p']:.2g}"
        )  # fmt: skip
        tok_s, stale = (
            _fmt(x.get("tokens_per_s"), ".2f"),
            _fmt(x.get("staleness_token_mean"), ".2f"),
        )
        kl = f"{_fmt(x.get('behavior_kl_mean'), '.4f')} / {_fmt(x.get('behavior_kl_max'), '.3f')}"
        lines.append(
            f"| {x['seed']} | {x['cell']} ({Path(x['run_dir']).parent.name}) | {held}%"
            f" | {paired} | {tok_s}"
            f" | {stale} / {x.get('staleness_token_max', '-')}"
            f" | {_fmt(x.get('staleness_short_episodes'), '.2f')}"
            f" / {_fmt(x.get('staleness_long_episodes'), '.2f')}"
            f" | {_fmt(x.get('masked_frac'), '.4f')} | {_fmt(x.get('truncated_frac'), '.4f')}"
            f" | {kl} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="async_vs_sync JSON files, one cell each")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    results = [json.loads(Path(p).read_text()) for p in args.results]
    rows = parity_rows(results)
    print(table(rows))
    if args.json:
        write_json(args.json, {"benchmark": "async_parity", "sources": args.results, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
