"""The buffer's cost per call from 10 to 10,000 concurrent episodes.

    PYTHONPATH=. python benchmarks/buffer_scale.py [--json benchmarks/results/buffer_scale.json]

A steady state at each size ``n``: ``n`` groups of one episode pending (staleness bound 7,
``n / 8`` groups per step, ``batch_order=ready`` and ``admission``). Each round completes one
in-flight group (in a shuffled order, so batches pass over slow groups), polls ``pop_batch``
once (as the trainer does) and, after a batch, sets the version and admits again. Prints
microseconds per ``admit`` (per task admitted), per ``complete``, per ``pop_batch`` call that
finds no batch (the trainer's poll) and per group of a batch taken (a batch is ``G`` groups, so
a call that takes one costs ``O(G)`` by its size).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from areal_agents.trainers.buffer import BatchOrder, TrajectoryBuffer
from areal_agents.types import Trajectory

TRAJ = [Trajectory((), (), (), (), reward=1.0, group_id="g")]


def measure(n: int, order: BatchOrder, rounds: int) -> dict[str, float]:
    eta = 7
    g = max(1, n // (eta + 1))
    buf = TrajectoryBuffer(g, eta, batch_order=order)
    rng = random.Random(0)
    inflight = [ref.index for ref, _ in buf.admit(n)]
    version = 0
    t_admit = t_poll = t_take = t_complete = 0.0
    admitted = polls = 0
    for _ in range(rounds):
        if inflight:
            i = inflight.pop(rng.randrange(min(len(inflight), max(1, g))))
            t0 = time.perf_counter()
            buf.complete(i, TRAJ)
            t_complete += time.perf_counter() - t0
        t0 = time.perf_counter()
        batch = buf.pop_batch()
        dt = time.perf_counter() - t0
        if batch is None:
            t_poll += dt
            polls += 1
        else:
            t_take += dt
            version += 1
            buf.set_version(version)
            t0 = time.perf_counter()
            new = buf.admit(n)
            t_admit += time.perf_counter() - t0
            admitted += len(new)
            inflight.extend(ref.index for ref, _ in new)
    return {
        "concurrent": n,
        "batch_order": order,
        "admit_us": round(1e6 * t_admit / max(1, admitted), 2),
        "complete_us": round(1e6 * t_complete / rounds, 2),
        "pop_none_us": round(1e6 * t_poll / max(1, polls), 2),
        "pop_batch_us_per_group": round(1e6 * t_take / max(1, version * g), 2),
        "groups_per_step": g,
        "batches": version,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    print(
        f"{'episodes':>9} {'order':>10} {'G':>5} {'admit us':>9} {'complete us':>12} "
        f"{'pop (no batch) us':>18} {'pop (batch) us/group':>21}"
    )
    for order in ("ready", "admission"):
        for n in (int(s) for s in args.sizes.split(",")):
            r = measure(n, order, args.rounds)  # type: ignore[arg-type]
            rows.append(r)
            print(
                f"{n:>9} {order:>10} {r['groups_per_step']:>5} {r['admit_us']:>9.2f} "
                f"{r['complete_us']:>12.2f} {r['pop_none_us']:>18.2f} "
                f"{r['pop_batch_us_per_group']:>21.2f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "buffer_scale", "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
