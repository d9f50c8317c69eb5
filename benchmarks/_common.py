"""Shared plumbing of the benchmarks: what machine they ran on, and where results go.

Every benchmark prints its figures and writes the same figures as JSON (``--json PATH``), with
a ``machine`` section that records the CPU count, the load average before and after, and the
busiest other processes at start: on a shared machine those explain noisy timings.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_agents.files import atomic_write

__all__ = [
    "REPO",
    "RESULTS",
    "git_commit",
    "latency",
    "machine_info",
    "other_load",
    "write_json",
]

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
if str(REPO) not in sys.path:  # run as a script, a benchmark still imports ``benchmarks.*``
    sys.path.append(str(REPO))  # (the workloads' environments: ``benchmarks.workloads:...``)


def git_commit() -> str:
    """The commit the benchmark ran on (``+dirty`` when the tree has changes)."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def other_load(limit: int = 6) -> list[str]:
    """The busiest processes not started by this one (``%cpu command``), from ``ps``."""
    try:
        out = subprocess.run(
            ["ps", "-eo", "pid,ppid,pcpu,args", "--sort=-pcpu"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.splitlines()[1:]
    except (OSError, subprocess.SubprocessError):
        return []
    me = os.getpid()
    rows = []
    for line in out:
        parts = line.split(None, 3)
        if len(parts) < 4 or int(parts[0]) == me or int(parts[1]) == me:
            continue
        if float(parts[2]) < 5.0:
            break
        rows.append(f"{parts[2]}% {parts[3][:110]}")
        if len(rows) >= limit:
            break
    return rows


def machine_info() -> dict[str, Any]:
    """CPU count, torch threads, load average and other busy processes, right now."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "others": other_load(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": git_commit(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def latency(
    samples_s: Sequence[float], unit: str = "ms", digits: int = 3, *, p99: bool = False
) -> dict[str, float]:
    """Count, median, 90th (and 99th) percentile and mean of ``samples_s`` (seconds), in ``unit``.

    Keys are ``n``, ``median_<unit>``, ``p90_<unit>``, ``p99_<unit>`` (with ``p99``) and
    ``mean_<unit>``; no samples give ``{"n": 0}``.

    >>> latency([0.001, 0.002, 0.004])
    {'n': 3, 'median_ms': 2.0, 'p90_ms': 2.0, 'mean_ms': 2.333}
    >>> latency([0.5e-6, 1.5e-6], "us", 1, p99=True)
    {'n': 2, 'median_us': 1.0, 'p90_us': 0.5, 'p99_us': 0.5, 'mean_us': 1.0}
    """
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    xs = sorted(s * scale for s in samples_s)
    if not xs:
        return {"n": 0}
    out = {"n": len(xs), f"median_{unit}": round(statistics.median(xs), digits)}
    out[f"p90_{unit}"] = round(xs[int(0.9 * (len(xs) - 1))], digits)
    if p99:
        out[f"p99_{unit}"] = round(xs[int(0.99 * (len(xs) - 1))], digits)
    out[f"mean_{unit}"] = round(statistics.fmean(xs), digits)
    return out


_ABSOLUTE_DIRS = re.compile(r"(?<=[\s\"'\[=(])/(?:[\w.+-]+/)+")


def write_json(path: str | Path | None, data: dict[str, Any]) -> None:
    """Write ``data`` (with the load average at the end added) as indented JSON."""
    if not path:
        return
    data = {**data, "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, default=str) + "\n"
    # results are committed: paths inside the checkout are written relative to it
    for root in {str(REPO), os.getcwd()}:
        text = text.replace(json.dumps(root + os.sep)[1:-1], "")
    # ... and other absolute paths (other processes' command lines) keep only their last part
    text = _ABSOLUTE_DIRS.sub("", text)
    atomic_write(target, text)
    print(f"wrote {target}", file=sys.stderr)
