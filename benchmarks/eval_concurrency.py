"""How long the trainer's held-out evaluation takes at each ``eval.concurrency``.

The held-out and validation tasks are scored by :func:`areal_agents.trainers.held_out.evaluate`
against the trainer's server; this serves ``MODEL`` on one built-in server (as a local run
does) and times that call at each concurrency in turn, on the same server, printing the seconds
and the success rate (greedy: the outcomes should not depend on the concurrency).

    python -m benchmarks.eval_concurrency runs/rl_gain_norm/code_sandbox-seed2/warm_start \\
        --concurrency 8,16,32,8
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    from areal_agents.config import load_config
    from areal_agents.serving.server import BuiltinServer
    from areal_agents.trainers.config import TrainConfig
    from areal_agents.trainers.held_out import evaluate

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model directory (a run's warm start, final weights)")
    parser.add_argument("--concurrency", default="8,16")
    parser.add_argument("overrides", nargs="*", help="train config overrides (env=..., eval.*)")
    args = parser.parse_intermixed_args(argv)
    with (
        BuiltinServer(args.model, served_model_name="policy") as server,
        tempfile.TemporaryDirectory() as scratch,
    ):
        for c in (int(x) for x in args.concurrency.split(",")):
            cfg = load_config(
                TrainConfig,
                [
                    "env=code_sandbox",
                    "log.progress=false",
                    *args.overrides,
                    f"eval.concurrency={c}",
                ],
            )
            started = time.perf_counter()
            result = evaluate(cfg, server.base_url, "policy", Path(scratch) / str(c))
            seconds = time.perf_counter() - started
            print(
                f"eval.concurrency={c}: {cfg.eval.held_out_tasks} tasks in {seconds:.1f} s, "
                f"success {result['success']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
