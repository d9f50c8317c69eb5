"""A run on a 2-node loopback cluster, with a 1-CPU head and a 2-CPU second node (issue 30).

- The calculator example with ``ray.actor_cpus=1`` fits (three 1-CPU bundles on 1 + 2 CPUs)
  and runs to the end; with one rollout worker more it does not fit, and the run exits with
  the capacity error (what it needs, what each node has free, the keys to change) within
  ``ray.placement_timeout_s``, never waiting in silence.
- ``kill -9`` of every process of the second node in the middle of a run: the server and the
  rollout worker it held are started again in their bundles, which Ray moves to the head, and
  the run finishes with exact accounting, as after the local kills of ``test_faults.py`` (where
  a lost learner rank is tried).

The cluster is ``ray.cluster_utils.Cluster`` on 127.0.0.1, started by the test; its processes
are killed by their PIDs only. The GCS is told to declare a silent node dead after 3 missed
health checks 1 s apart (Ray's default: 5, 3 s apart), to keep the test short.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from areal_agents.files import read_jsonl
from areal_agents.trainers.cluster import loopback_only
from tests.trainers.test_faults import VICTIMS, check_accounting, rows, start_run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HEAD_CPUS, NODE_CPUS = 1, 2
#: the nodes' memory (Ray's logical resource): with these, SPREAD puts the learner on the head
#: and the server and the rollout worker on the second node (Ray scores a node by the share of
#: each resource it has left: the learner's 0.6 GB is a large share of 2.5 GB, the worker's
#: 0.25 CPU a small one of 2), and the head still holds all three once that node is gone
HEAD_MEMORY, NODE_MEMORY = 16 * 2**30, 2560 * 2**20
CALCULATOR = [
    "env=calculator",
    "model=tiny",
    "env.group_size=2",
    "trainer.groups_per_step=1",
    "inference.max_tokens=8",
    "eval.held_out_tasks=0",
    "log.progress=false",
    "log.tensorboard=false",
    "ray.connect_timeout_s=20",
]
#: the second node's actors, as their processes are named (``test_faults.VICTIMS``)
ACTORS = {
    "learner": VICTIMS["learner"],
    "server": "ray::_ServerHost",
    "rollout_worker": VICTIMS["rollout_worker"],
}


class TwoNodes:
    """A head with ``HEAD_CPUS`` CPUs and a second node with ``NODE_CPUS``, on 127.0.0.1."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        node = {"object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
        fast_death = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
        head = {**node, "num_cpus": HEAD_CPUS, "memory": HEAD_MEMORY, "include_dashboard": False}
        self.cluster = Cluster(
            initialize_head=True, head_node_args={**head, "_system_config": fast_death}
        )
        self.second = self.cluster.add_node(**node, num_cpus=NODE_CPUS, memory=NODE_MEMORY)
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address

    def second_node_processes(self) -> list[psutil.Process]:
        """Every process of the second node: its Ray daemons and all they started (its
        workers, the actors' own children: a server's process)."""
        found: dict[int, psutil.Process] = {}
        for infos in self.second.all_processes.values():
            for info in infos:
                try:
                    top = psutil.Process(info.process.pid)
                    for p in [top, *top.children(recursive=True)]:
                        found[p.pid] = p
                except psutil.NoSuchProcess:
                    continue
        return list(found.values())

    def kill_second_node(self) -> list[str]:
        """``kill -9`` of every process of the second node; returns the actor kinds it held."""
        processes = self.second_node_processes()
        held = []
        for kind, pattern in ACTORS.items():
            for p in processes:
                try:
                    if pattern in p.name() or pattern in " ".join(p.cmdline()):
                        held.append(kind)
                except psutil.NoSuchProcess:
                    continue
        for p in processes:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        return held

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture
def two_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoNodes]:
    tmp = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths stay under 108 bytes
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RAY_worker_niceness", "0")
    loopback_only()
    nodes = TwoNodes()
    try:
        yield nodes
    finally:
        nodes.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def train(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "areal_agents.train", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_one_cpu_head_and_a_two_cpu_node_run_the_example_or_say_it_does_not_fit(
    two_nodes: TwoNodes, tmp_path: Path
) -> None:
    on = [*CALCULATOR, f"ray.address={two_nodes.address}", "ray.actor_cpus=1"]
    # one rollout worker more than 3 CPUs hold: refused within ray.placement_timeout_s
    start = time.monotonic()
    too_big = ["trainer.rollout_workers=2", "ray.placement_timeout_s=12"]
    refused = train(
        [*on, *too_big, "trainer.total_steps=2", f"output_dir={tmp_path / 'too_big'}"],
        timeout=240,
    )
    assert refused.returncode == 2  # a CapacityError is a ConfigError
    assert time.monotonic() - start < 180  # Python, Ray and the model directory; not minutes
    message = refused.stderr + refused.stdout
    assert "does not fit the Ray cluster" in message and "waited 12 s" in message, message[-3000:]
    assert "waiting for the cluster to hold the run's 4 bundles (10 s" in message  # meanwhile
    assert "2 rollout workers x CPU 1" in message and "in all: CPU 4" in message
    assert message.count("CPU 1 of 1") + message.count("CPU 2 of 2") == 2  # both nodes, free
    assert "trainer.rollout_workers" in message and "ray.actor_cpus" in message
    # the example as the issue ran it: three 1-CPU actors on 1 + 2 CPUs, to the end
    done = train([*on, "trainer.total_steps=2", f"output_dir={tmp_path / 'run'}"], timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["finished"] and summary["final_version"] == 2


def test_the_second_node_killed_mid_run_its_actors_come_back_and_the_run_finishes_exactly(
    two_nodes: TwoNodes, tmp_path: Path
) -> None:
    steps, run_dir, log = 6, tmp_path / "run", tmp_path / "out.log"
    args = [
        *CALCULATOR,
        "trainer.groups_per_step=2",
        f"trainer.total_steps={steps}",
        "trainer.checkpoint_interval_s=null",
        "trainer.checkpoint_every=2",
        f"ray.address={two_nodes.address}",
        "ray.actor_cpus=0.25",  # all three fit the 1-CPU head once the second node is gone
        "ray.placement_strategy=SPREAD",  # and both nodes hold some while both live
        "ray.placement_timeout_s=60",
        f"output_dir={run_dir}",
    ]
    proc = start_run(args, log)
    try:
        wait_for(lambda: len(rows(run_dir)) >= 2, proc, log)
        wait_for(lambda: (run_dir / "checkpoints" / "step_000002").is_dir(), proc, log)
        held = two_nodes.kill_second_node()
        assert sorted(held) == ["rollout_worker", "server"], f"placed otherwise: {held}"
        assert proc.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = check_accounting(run_dir, steps=steps, groups=2)
    output = log.read_text()
    events = read_jsonl(run_dir / "faults.jsonl")
    assert sorted(e["kind"] for e in events) == ["rollout_worker", "server"], output[-3000:]
    assert all(e["step"] >= 2 and e["restart_s"] > 0 for e in events)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == {"server": 1, "rollout_worker": 1, "learner": 0}
    assert done[-1]["restarts/server"] == done[-1]["restarts/rollout_worker"] == 1
