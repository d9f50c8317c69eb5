"""The reaper kills exactly the processes of a run — by its mark or by an open file in its
session directory — once the driver is gone (even by ``kill -9``), and spares everything else.

No Ray here: stand-in processes play Ray's (the real thing is in ``test_runtime.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from areal_agents.trainers.ray_reaper import RUN_ENV, RayReaper

ROOT = Path(__file__).resolve().parents[2]
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_dead(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _holding(path: Path) -> list[str]:
    """A process that keeps ``path`` open (as a Ray process keeps its log), unmarked."""
    code = f"f = open({str(path)!r}, 'w'); import time; time.sleep(600)"
    return [sys.executable, "-c", code]


DRIVER = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from areal_agents.trainers.ray_reaper import RUN_ENV, RayReaper

    session, sleep, holding = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    reaper = RayReaper.start()
    reaper.watch(session)
    marked = dict(os.environ, **{RUN_ENV: reaper.token})
    clean = {k: v for k, v in os.environ.items() if k != RUN_ENV}
    child = subprocess.Popen(sleep, env=marked, start_new_session=True)
    grandchild = subprocess.Popen(  # a child of a marked process inherits the mark
        [sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen("
         + repr(sleep) + "); print(p.pid, flush=True); time.sleep(600)"],
        env=marked, stdout=subprocess.PIPE, text=True,
    )
    logger = subprocess.Popen(holding, env=clean, start_new_session=True)
    other = subprocess.Popen(sleep, env=clean, start_new_session=True)
    inner = int(grandchild.stdout.readline())
    print(json.dumps({"run": [child.pid, grandchild.pid, inner, logger.pid],
                      "other": other.pid, "reaper": reaper.process.pid}), flush=True)
    time.sleep(600)
    """
)


def test_kill_9_of_the_driver_reaps_the_run_and_spares_the_rest(tmp_path: Path) -> None:
    session = tmp_path / "session_x"
    (session / "logs").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(session),
            json.dumps(SLEEP),
            json.dumps(_holding(session / "logs" / "worker.out")),
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert driver.stdout is not None
    pids = json.loads(driver.stdout.readline())
    time.sleep(0.5)  # let the logger open its file
    try:
        assert all(_alive(p) for p in [*pids["run"], pids["other"], pids["reaper"]])
        driver.kill()  # SIGKILL: no atexit, no finally
        driver.wait()
        assert _wait_dead(pids["run"], 10) == []
        assert _wait_dead([pids["reaper"]], 10) == []  # it exits once done
        assert _alive(pids["other"])
    finally:
        for pid in [*pids["run"], pids["other"]]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sweep_now_spares_the_driver_and_unrelated_processes(tmp_path: Path) -> None:
    session = tmp_path / "session_y"
    (session / "logs").mkdir(parents=True)
    reaper = RayReaper.start()
    reaper.watch(str(session))
    marked = {**os.environ, RUN_ENV: reaper.token}
    other_mark = {**os.environ, RUN_ENV: "another-run"}
    run = [
        subprocess.Popen(SLEEP, env=marked),
        subprocess.Popen(_holding(session / "logs" / "raylet.out")),
    ]
    spared = [subprocess.Popen(SLEEP), subprocess.Popen(SLEEP, env=other_mark)]
    time.sleep(0.5)
    try:
        reaper.sweep_now()
        assert reaper.process.returncode is not None  # the reaper finished
        assert [p.wait(timeout=10) for p in run] == [-signal.SIGKILL] * 2
        assert all(p.poll() is None for p in spared)
        assert RUN_ENV not in os.environ  # the driver never carries the mark itself
    finally:
        for p in [*run, *spared]:
            p.kill()
            p.wait()


def test_a_closed_pipe_waits_for_the_driver_to_exit(tmp_path: Path) -> None:
    """``close()`` (at exit) must not reap while the driver still runs its own shutdown."""
    reaper = RayReaper.start()
    marked = subprocess.Popen(SLEEP, env={**os.environ, RUN_ENV: reaper.token})
    try:
        reaper.close()
        time.sleep(1.0)
        assert marked.poll() is None and reaper.process.poll() is None
    finally:
        for p in (reaper.process, marked):
            p.kill()
            p.wait()
