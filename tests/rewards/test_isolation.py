"""The grading process pool: persistent warm workers, killed on their time limit, replaced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from areal_agents.errors import ConfigError
from areal_agents.rewards import FunctionReward, GraderPool, GradingFailed, RewardTimeout
from areal_agents.rewards.isolation import default_pool, run_isolated


@pytest.fixture(scope="module")
def pool() -> GraderPool:
    pool = GraderPool(max_workers=2, preload=())
    yield pool
    pool.close()


def test_values_and_exceptions_come_back(pool: GraderPool) -> None:
    assert pool.run(pow, 2, 10, timeout_s=30) == 1024
    assert pool.run(sorted, [3, 1, 2], timeout_s=30, reverse=True) == [3, 2, 1]
    with pytest.raises(ValueError, match="invalid literal"):
        pool.run(int, "x", timeout_s=30)


def test_every_grade_runs_in_a_fresh_worker_and_a_timed_out_one_is_killed(
    pool: GraderPool,
) -> None:
    first = pool.run(os.getpid, timeout_s=30)
    second = pool.run(os.getpid, timeout_s=30)
    assert len({first, second, os.getpid()}) == 3  # never a reused worker (issue 28, H1)
    start = time.monotonic()
    with pytest.raises(RewardTimeout):
        pool.run(pow, 9, 9**9, timeout_s=0.5)  # holds the GIL of its process for minutes
    assert time.monotonic() - start < 20  # it came back: a thread-based limit never would
    assert pool.run(pow, 2, 5, timeout_s=30) == 32
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in (first, second)) and time.monotonic() < deadline:
        pool.run(abs, 1, timeout_s=30)  # each request lets the zygote reap the used workers
        time.sleep(0.05)
    assert not any(_alive(p) for p in (first, second))


def test_a_worker_that_dies_on_its_input_is_a_grading_failure(pool: GraderPool) -> None:
    with pytest.raises(GradingFailed, match="died"):
        pool.run(os._exit, 3, timeout_s=30)
    with pytest.raises(GradingFailed, match="SystemExit"):
        pool.run(sys.exit, 0, timeout_s=30)  # never re-raised as SystemExit here
    assert pool.run(pow, 3, 3, timeout_s=30) == 27


def test_concurrent_grades_are_bounded_independently(pool: GraderPool) -> None:
    results: list[object] = []

    def grade(i: int) -> None:
        try:
            results.append(
                pool.run(pow, 9, 9**9, timeout_s=1) if i == 0 else pool.run(abs, -i, timeout_s=30)
            )
        except RewardTimeout as e:
            results.append(e)

    threads = [threading.Thread(target=grade, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r for r in results if isinstance(r, int)) == [1, 2, 3, 4]
    assert sum(isinstance(r, RewardTimeout) for r in results) == 1


def test_only_importable_functions_and_positive_limits(pool: GraderPool) -> None:
    with pytest.raises(ConfigError, match="module level"):
        pool.run(lambda: 1, timeout_s=5)
    with pytest.raises(ConfigError, match="timeout_s"):
        pool.run(pow, 2, 2, timeout_s=0)
    with pytest.raises(ConfigError, match="module level"):
        FunctionReward(lambda r, ref: 1.0, isolate=True)


def test_function_reward_isolated_times_out_instead_of_hanging() -> None:
    assert FunctionReward(max, isolate=True)(0.0, 1.0).status == "correct"  # type: ignore[arg-type]
    slow = FunctionReward(pow, timeout_s=0.5, isolate=True)
    assert slow(9, 9**9).status == "timeout"  # type: ignore[arg-type]


def test_the_default_pool_is_shared() -> None:
    assert default_pool() is default_pool()
    assert run_isolated(max, 1, 5, timeout_s=30) == 5


def _zygote_pid() -> int:
    return default_pool()._state["proc"].pid  # type: ignore[no-any-return]


def test_a_forked_child_gets_its_own_grader_and_the_parent_keeps_its_own() -> None:
    run_isolated(os.getpid, timeout_s=60)
    parent_zygote = _zygote_pid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the inherited pool is not shared, a new one starts
        try:
            run_isolated(os.getpid, timeout_s=120)
            os.write(write, str(_zygote_pid()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child_zygote = int(f.read() or 0)
    os.waitpid(pid, 0)
    assert child_zygote not in (0, parent_zygote)
    assert run_isolated(abs, -3, timeout_s=60) == 3
    assert _zygote_pid() == parent_zygote


_ORPHAN = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from areal_agents.rewards import GraderPool
    pool = GraderPool(preload=())
    pool.run(os.getpid, timeout_s=60)
    zygote = pool._state["proc"].pid
    threading.Thread(target=pool.run, args=(pow, 9, 9 ** 9), kwargs={"timeout_s": 600}).start()
    def cpu_ticks(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime
        except FileNotFoundError:
            return 0
    # the busy worker is the one that has computed for a while: a spare fetched ahead, or
    # one discarded because it was forked before the zygote had the job's module, has not
    worker = None
    while worker is None:
        worker = next((w.pid for w in list(pool._workers) if cpu_ticks(w.pid) >= 10), None)
        time.sleep(0.01)
    print(json.dumps([zygote, worker]), flush=True)
    threading.Event().wait()
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_no_grading_process_outlives_a_killed_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = json.loads(parent.stdout.readline())
        assert all(_alive(p) for p in pids)
        time.sleep(0.5)  # the busy worker is computing 9**9**9
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_a_parent_that_exits_while_the_grader_starts_leaves_no_traceback() -> None:
    """The zygote's "ready" message to a parent already gone is a broken pipe: it exits
    quietly instead of printing a traceback into the parent's terminal."""
    code = textwrap.dedent(
        """
        import os
        from areal_agents.rewards.isolation import prewarm
        prewarm()  # starts the grading process in the background
        os._exit(0)  # gone before it can say it is ready
        """
    )
    for _ in range(3):  # the race is the zygote's: try a few times (stderr is read to the end,
        # which is when the orphaned zygote has closed it too)
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0
        assert "Traceback" not in proc.stderr, proc.stderr
