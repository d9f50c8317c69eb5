"""Projection: async against sync on a GPU-like profile, and the best staleness bound.

    PYTHONPATH=. python benchmarks/sim_projection.py [--json benchmarks/results/sim_projection.json]

The ``gpu_h100_vllm_8b`` profile (public figures, sources in the file): 16 GPUs split between
vLLM servers and FSDP learner ranks (12 + 4, 8 + 8), 64 groups of 8 episodes per step, 12
steps; sync, then async at staleness 1, 2, 4, 8 and 16 (``batch_order=ready``). Prints each
setting's trained tokens/s, idle fractions and staleness, the async/sync ratio and the bound
that trains the most tokens per second (the smallest within 1% of the best: staleness costs
off-policyness, so a bigger bound must buy throughput). Sync is given twice: on the same split
(the trainer's ``trainer.mode=sync``: servers idle while the learners train) and colocated (all
16 GPUs generate, then all 16 train, as colocated synchronous trainers do; the push still
counts).
"""

from __future__ import annotations

import argparse
import json
import time

from areal_agents.simulate import run_table, table_lines
from areal_agents.simulation import SimConfig, load_profile, simulate

SPLITS = ((12, 4), (8, 8))
STALENESS = (1, 2, 4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="gpu_h100_vllm_8b")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    t0 = time.perf_counter()
    out = []
    for servers, learners in SPLITS:
        base = SimConfig(
            servers=servers, learners=learners, groups_per_step=64, group_size=8, steps=args.steps
        )
        rows = run_table(args.profile, base, STALENESS)
        # a colocated synchronous trainer: every GPU generates, then every GPU trains
        gpus = servers + learners
        colo = simulate(
            load_profile(args.profile),
            SimConfig(**{**base.__dict__, "mode": "sync", "servers": gpus, "learners": gpus}),
        )
        best_tps = max(r["tokens_per_s"] for r in rows[1:])
        best = next(r for r in rows[1:] if r["tokens_per_s"] >= 0.99 * best_tps)
        print(f"\n{servers} servers + {learners} learners ({args.profile})")
        print("\n".join(table_lines(rows)))
        colo_ratio = round(best["tokens_per_s"] / colo.tokens_per_s, 3)
        print(
            f"sync colocated on all {gpus} GPUs: {colo.tokens_per_s:.0f} tok/s "
            f"(generation idle {100 * colo.generation_idle_frac:.0f}% of its time)"
        )
        print(
            f"best staleness: {best['setting']} ({best['vs_sync']:.2f}x sync on the same split, "
            f"{colo_ratio:.2f}x colocated sync)"
        )
        out.append(
            {
                "servers": servers,
                "learners": learners,
                "rows": rows,
                "best": best["setting"],
                "best_vs_sync": best["vs_sync"],
                "sync_colocated": colo.to_dict(),
                "best_vs_sync_colocated": colo_ratio,
            }
        )
    print(f"\nsimulated in {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"benchmark": "sim_projection", "profile": args.profile, "splits": out}, f, indent=2
            )


if __name__ == "__main__":
    main()
