"""Per-grade cost of killable grading, against the thread-based check it replaced (same run).

    python benchmarks/grading.py [--grades 300] [--json results/grading.json]

Prints, for math-verify on distinct answers (no parser cache hits), the time per grade when
run in the caller with a waiting thread (``call_with_timeout``, the old way: it cannot stop a
runaway sympy power) and in the pre-warmed grading process (``run_isolated``), interleaved so
that load from other jobs hits both alike; the bare round trip of a trivial job; what a
timeout costs (kill and a fresh fork of the warm zygote) and the one-off zygote start.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import latency, machine_info, write_json

from areal_agents.rewards import RewardTimeout, call_with_timeout, math_equal
from areal_agents.rewards.isolation import GraderPool


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(grades: int = 300, timeouts: int = 5) -> dict[str, Any]:
    """The figures (see the module docstring) as a dict."""
    pool = GraderPool(max_workers=1)
    start = time.perf_counter()
    pool.start(wait=True)
    zygote_s = time.perf_counter() - start
    pool.run(math_equal, "1", "1", timeout_s=60)  # fork the first worker
    math_equal(r"\frac{1}{2}", "0.5")  # warm the in-process parser too
    thread, isolated, round_trip = [], [], []
    for i in range(grades):
        a, b = i, i + 10 * grades  # distinct answers in each mode: no lru_cache hits
        thread.append(
            _timed(
                lambda a=a: call_with_timeout(
                    lambda: math_equal(f"{a}/{a + 7}", f"{a}/{a + 7}"), 60
                )
            )
        )
        isolated.append(
            _timed(lambda b=b: pool.run(math_equal, f"{b}/{b + 7}", f"{b}/{b + 7}", timeout_s=60))
        )
        round_trip.append(_timed(lambda: pool.run(pow, 2, 3, timeout_s=60)))
    after_timeout, timed_out = [], []
    for _ in range(timeouts):
        start = time.perf_counter()
        try:
            pool.run(pow, 9, 9**9, timeout_s=0.5)
        except RewardTimeout:
            timed_out.append(time.perf_counter() - start)
        after_timeout.append(_timed(lambda: pool.run(pow, 2, 3, timeout_s=60)))
    pool.close()
    figures = {
        "math_verify_in_thread": latency(thread),
        "math_verify_in_grading_process": latency(isolated),
        "round_trip_trivial_job": latency(round_trip),
        "timeout_0.5s_returned_after": latency(timed_out),
        "first_job_after_a_timeout": latency(after_timeout),
        "zygote_start_s": round(zygote_s, 2),
    }
    extra = figures["math_verify_in_grading_process"]["median_ms"]
    extra -= figures["math_verify_in_thread"]["median_ms"]
    figures["overhead_per_grade_median_ms"] = round(extra, 3)
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grades", type=int, default=300)
    parser.add_argument("--timeouts", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    machine = machine_info()
    figures = measure(args.grades, args.timeouts)
    for key, value in figures.items():
        print(f"{key:34s} {value}")
    result = {"machine": machine, "figures": figures}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
