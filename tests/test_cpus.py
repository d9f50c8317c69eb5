"""CPU placement: the list format, the start-up check, and pinning a process and its children."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from areal_agents.cpus import affinity_hook, available_cpus, check_cpus, cpu_list, pin_process
from areal_agents.errors import ConfigError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux affinity")


@pytest.fixture
def restore_affinity() -> Iterator[set[int]]:
    """This process's cores before the test, given back after it (every thread)."""
    before = set(os.sched_getaffinity(0))
    yield before
    pin_process(sorted(before))


def test_cpu_list_in_the_kernels_format() -> None:
    assert cpu_list([3, 0, 1, 2, 7, 9, 8]) == "0-3,7-9"
    assert cpu_list([5, 5]) == "5"


def test_check_names_the_key_and_the_cores_there_are() -> None:
    check_cpus(None, "inference.cpus")
    check_cpus(sorted(available_cpus()), "inference.cpus")
    missing = max(available_cpus()) + 1
    with pytest.raises(ConfigError, match=rf"inference.cpus=\[{missing}\]: no core \[{missing}\]"):
        check_cpus([missing], "inference.cpus")
    with pytest.raises(ConfigError, match=r"trainer.learner_cpus=\[\]: name at least one"):
        check_cpus([], "trainer.learner_cpus")


def test_pin_process_moves_every_thread_and_what_it_starts(restore_affinity: set[int]) -> None:
    core = min(restore_affinity)
    started = threading.Event()
    release = threading.Event()

    def worker() -> None:  # a thread that exists before the pin (torch's pool, say)
        started.set()
        release.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    started.wait()
    try:
        pin_process([core])
        tids = os.listdir("/proc/self/task")
        assert {tid: os.sched_getaffinity(int(tid)) for tid in tids} == {t: {core} for t in tids}
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert child.stdout.strip() == f"[{core}]"
    finally:
        release.set()
        thread.join()


def test_affinity_hook_places_only_the_child(restore_affinity: set[int]) -> None:
    core = max(restore_affinity)
    ran = []
    hook = affinity_hook([core], then=lambda: ran.append(1))
    assert hook is not None and affinity_hook(None) is None
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=hook,
    )
    assert out.stdout.strip() == f"[{core}]"
    assert set(os.sched_getaffinity(0)) == restore_affinity  # the parent stays where it was
