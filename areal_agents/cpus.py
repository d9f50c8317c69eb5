"""Which CPU cores a process runs on (Linux affinity): placement on a machine without GPUs.

On a CPU host the inference servers and the learners share the cores. Left to the scheduler,
every process runs everywhere: a learner's thread lands on the core a server's OpenMP threads
are bound to, and vLLM's scheduler process, which polls its worker between decoding steps, takes
half of the learner's core. ``inference.cpus`` and ``trainer.learner_cpus`` split the cores
instead, as one would split GPUs; the command lines check them at start-up
(:func:`check_cpus`) and each process applies its own set (:func:`pin_process`, or
:func:`affinity_hook` in a child before it execs; children inherit the set).

>>> cpu_list((0, 1, 2, 5))
'0-2,5'
>>> cpu_list((3,))
'3'
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from areal_agents.errors import ConfigError

__all__ = ["affinity_hook", "available_cpus", "check_cpus", "cpu_list", "pin_process"]


def cpu_list(cpus: Sequence[int]) -> str:
    """``cpus`` in the kernel's list format (``0-2,5``), as ``taskset -c`` and vLLM's
    ``VLLM_CPU_OMP_THREADS_BIND`` take it."""
    ids = sorted(set(int(c) for c in cpus))
    parts: list[str] = []
    start = prev = ids[0]
    for c in [*ids[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(parts)


def available_cpus() -> set[int]:
    """The cores this process may run on (all of them where affinity is not supported)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def check_cpus(cpus: Sequence[int] | None, key: str) -> None:
    """Raise :class:`ConfigError` unless ``cpus`` (the value of config ``key``; None: no
    placement) is a non-empty set of cores this process may use, on Linux."""
    if cpus is None:
        return
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError(f"{key}={list(cpus)}: CPU placement needs Linux; leave {key}=null")
    if not cpus:
        raise ConfigError(f"{key}=[]: name at least one core, or null for all of them")
    unknown = sorted(set(int(c) for c in cpus) - available_cpus())
    if unknown:
        raise ConfigError(
            f"{key}={list(cpus)}: no core {unknown} here; this machine has cores "
            f"{cpu_list(sorted(available_cpus()))}"
        )


def pin_process(cpus: Sequence[int] | None) -> None:
    """Run every thread of this process (and whatever it starts later) on ``cpus`` only;
    None leaves the process where it is."""
    if cpus is None:
        return
    wanted = set(int(c) for c in cpus)
    tasks = Path("/proc/self/task")
    threads = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue


def affinity_hook(
    cpus: Sequence[int] | None, then: Callable[[], None] | None = None
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that moves the child onto ``cpus`` and then runs ``then`` (None when
    there is nothing to do)."""
    if cpus is None:
        return then
    wanted = set(int(c) for c in cpus)

    def hook() -> None:
        os.sched_setaffinity(0, wanted)
        if then is not None:
            then()

    return hook if sys.platform.startswith("linux") else then
