"""Scale: the simulator at cluster size — 64 servers, 4,096 concurrent episodes.

    PYTHONPATH=. python benchmarks/sim_scale.py

Simulates async training (staleness 4, ``batch_order=ready``) with 64 inference servers of the
``gpu_h100_vllm_8b`` profile, 256 groups of 16 episodes in flight (4,096 episodes), 64 groups
per step, and prints the wall time of the simulation (target: under a minute) with the
simulated figures; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import time

from areal_agents.simulate import sim_config
from areal_agents.simulation import load_profile, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=4096, help="concurrent episodes")
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--groups-per-step", type=int, default=64)
    parser.add_argument("--learners", type=int, default=32)
    parser.add_argument("--staleness", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cfg = sim_config(
        args,
        mode="async",
        max_staleness=args.staleness,
        concurrent_groups=args.episodes // args.group_size,
    )
    t0 = time.perf_counter()
    res = simulate(load_profile("gpu_h100_vllm_8b"), cfg)
    wall = time.perf_counter() - t0
    print(
        f"{args.servers} servers, {args.episodes} concurrent episodes, {args.steps} steps: "
        f"simulated {res.elapsed_s:.0f} s of training in {wall:.1f} s wall"
    )
    print(json.dumps(res.to_dict()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"config": vars(args), "wall_s": round(wall, 2), **res.to_dict()}, f, indent=2
            )


if __name__ == "__main__":
    main()
