"""Who restarts what: the run's own supervision of its servers and rollout workers.

A :class:`Supervisor` thread in the driver looks every ``poll_s`` at the inference servers
(:func:`~areal_agents.trainers.inference.server_alive`: the child process locally, the host
actor and its process on a cluster) and at the rollout workers (their ``run`` calls: one that
ends in ``RayActorError`` is a dead actor). What died is started again in its own bundle of
the run's placement group (Ray moves a bundle whose node is gone), at most ``ray.max_restarts``
times per kind:

- **a server**: every rollout worker pauses (the groups it had in flight go back to the buffer,
  which admits them again first), the server is started again, loaded with the newest weight
  version (:meth:`~areal_agents.trainers.weight_sync.WeightSync.reload`), and the workers go
  on with its new address;
- **a rollout worker**: the buffer takes back the tasks it held (by its id), and a new worker
  with the same id takes its place.

A learner rank's death is not handled here: the loop's next call on the learners raises
:class:`~areal_agents.errors.LearnerLost` and the run goes back to its last checkpoint
(``trainers/loop.py``). Every restart is a line of ``faults.jsonl`` in the run directory
(:class:`FaultLog`), counted in the step metrics (``restarts/*``) and the summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from areal_agents.errors import AgentsError
from areal_agents.files import read_jsonl
from areal_agents.serving.base import InferenceServer
from areal_agents.trainers.inference import server_alive, stop_servers
from areal_agents.trainers.placement import Placement
from areal_agents.trainers.weight_sync import WeightSync

__all__ = ["FaultLog", "Supervisor"]

logger = logging.getLogger(__name__)

RESTART_KINDS = ("server", "rollout_worker", "learner")


class FaultLog:
    """``faults.jsonl`` of a run: one line per restart (its kind, index, step, what it took),
    kept across resumes, so the counts cover the whole run."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "faults.jsonl"
        self.events: list[dict[str, Any]] = (
            read_jsonl(self.path, torn_ok=True) if self.path.is_file() else []
        )
        self._lock = threading.Lock()

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one event (``kind``: server, rollout_worker or learner) and return it."""
        event = {"kind": kind, "at": round(time.time(), 3), **fields}
        with self._lock:
            self.events.append(event)
            with self.path.open("a") as f:
                f.write(json.dumps(event) + "\n")
        print(f"restart: {_describe(event)}", flush=True)
        return event

    def counts(self) -> dict[str, int]:
        """Restarts per kind so far (``restarts/<kind>`` in the step metrics)."""
        with self._lock:
            return {k: sum(1 for e in self.events if e["kind"] == k) for k in RESTART_KINDS}


def _describe(event: dict[str, Any]) -> str:
    what = {"server": "inference server", "rollout_worker": "rollout worker"}.get(
        event["kind"], "learner"
    )
    took = f" in {event['restart_s']:.1f} s" if "restart_s" in event else ""
    again = f", {event['requeued']} group(s) admitted again" if event.get("requeued") else ""
    index = f" {event['index']}" if "index" in event else ""  # a learner's names none
    return f"{what}{index} at step {event.get('step')}{took}{again}"


class Supervisor:
    """Restarts the servers and rollout workers that die, from a thread of the driver.

    Args:
        servers: the run's servers (the list the loop and the weight push share; replaced in
            place).
        sync: the weight push (reloads a restarted server).
        buffer: the buffer actor (takes back a dead worker's tasks).
        placement: the run's placement group.
        start_server: ``fn(index) -> server``, ready (started in its bundle).
        start_worker: ``fn(index, incarnation, base_urls) -> actor``.
        workers: the rollout worker actors running now, and ``runs`` their ``run`` calls.
        max_restarts: restarts allowed per kind (``ray.max_restarts``).
        faults: where restarts are recorded.
        step: the loop's step now (for the records).
        placement_timeout_s: how long a restart waits for its bundle (a lost node's bundles
            move to the nodes left, if they fit).
    """

    def __init__(
        self,
        *,
        servers: list[InferenceServer],
        sync: WeightSync,
        buffer: Any,
        placement: Placement,
        start_server: Callable[[int], InferenceServer],
        start_worker: Callable[[int, int, list[str]], Any],
        workers: list[Any],
        runs: list[Any],
        max_restarts: int,
        faults: FaultLog,
        step: Callable[[], int],
        placement_timeout_s: float = 120.0,
        poll_s: float = 0.5,
    ) -> None:
        self.servers = servers
        self.sync = sync
        self.buffer = buffer
        self.placement = placement
        self.start_server = start_server
        self.start_worker = start_worker
        self.workers = workers
        self.runs = runs
        self.incarnations = [0] * len(workers)
        self.max_restarts = max_restarts
        self.faults = faults
        self.step = step
        self.placement_timeout_s = placement_timeout_s
        self.poll_s = poll_s
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        """Held while a restart changes the workers or servers."""
        self._used = {k: 0 for k in RESTART_KINDS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    # ---- the thread -----------------------------------------------------------------------

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self, timeout: float = 120.0) -> None:
        """Stop watching (a restart in progress finishes first, up to ``timeout``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def raise_if_failed(self) -> None:
        """Raise what ended the supervision (a death past ``ray.max_restarts``, a restart that
        failed, a rollout worker's own error) in the loop's thread."""
        if self.error is not None:
            raise self.error

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except BaseException as e:  # handed to the loop's thread
                self.error = e
                return

    # ---- one look ---------------------------------------------------------------------------

    def check(self) -> None:
        """Restart whatever died since the last look."""
        dead = [i for i, s in enumerate(self.servers) if not server_alive(s)]
        if dead:
            self.restart_servers(dead)
        if not self.runs:
            return
        finished, _ = ray.wait(list(self.runs), num_returns=len(self.runs), timeout=0)
        for ref in finished:
            index = self.runs.index(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self.restart_worker(index, f"{type(e).__name__}")
                continue
            if not self._stop.is_set():
                raise AgentsError("a rollout worker stopped while the trainer still needs data")

    def _budget(self, kind: str, what: str, count: int = 1) -> None:
        if self._used[kind] + count > self.max_restarts:
            raise AgentsError(
                f"{what} died, and the run has used its ray.max_restarts={self.max_restarts} "
                f"restarts of this kind; the last checkpoint is kept: re-run the same command "
                "to resume it (raise ray.max_restarts to restart more)"
            )
        self._used[kind] += count

    def urls_for(self, worker: int) -> list[str]:
        """The servers worker ``worker`` talks to: those on its node, else all."""
        near = self.placement.servers_near(worker, len(self.servers))
        return [str(self.servers[i].base_url) for i in near]

    def restart_servers(self, indices: list[int]) -> None:
        """Pause the workers (their groups in flight are admitted again), start the servers at
        ``indices`` again, load the newest weights into them, and let the workers go on."""
        start = time.perf_counter()
        names = ", ".join(f"inference server {i}" for i in indices)
        self._budget("server", names, len(indices))
        with self.lock:
            logger.warning("%s died: restarting", names)
            requeued: set[int] = set()
            for ref in [w.pause.remote() for w in self.workers]:
                with contextlib.suppress(ray.exceptions.RayActorError):  # a dead one: check()
                    requeued.update(ray.get(ref, timeout=120))
            stop_servers([self.servers[i] for i in indices])
            self.placement.wait_placed(self.placement_timeout_s, names)
            for i in indices:
                self.servers[i] = self.start_server(i)  # the list the push shares
            version = self.sync.reload(indices)
            for w, worker in enumerate(self.workers):
                with contextlib.suppress(ray.exceptions.RayActorError):
                    ray.get(worker.resume.remote(base_urls=self.urls_for(w)), timeout=120)
            took = time.perf_counter() - start
            for i in indices:
                self.faults.record(
                    "server",
                    index=i,
                    step=self.step(),
                    version=version,
                    requeued=len(requeued),
                    restart_s=round(took, 3),
                )

    def restart_worker(self, index: int, reason: str) -> None:
        """Take back worker ``index``'s tasks and start a new worker in its place."""
        start = time.perf_counter()
        what = f"rollout worker {index}"
        self._budget("rollout_worker", what)
        with self.lock:
            logger.warning("%s died (%s): restarting", what, reason)
            requeued = ray.get(self.buffer.requeue.remote(holder_prefix=f"{index}:"))
            with contextlib.suppress(Exception):
                ray.kill(self.workers[index])
            self.placement.wait_placed(self.placement_timeout_s, what)
            self.incarnations[index] += 1
            worker = self.start_worker(index, self.incarnations[index], self.urls_for(index))
            ray.get(worker.stats.remote(), timeout=self.placement_timeout_s)  # constructed
            self.workers[index] = worker
            self.runs[index] = worker.run.remote()
            self.faults.record(
                "rollout_worker",
                index=index,
                step=self.step(),
                requeued=len(requeued),
                restart_s=round(time.perf_counter() - start, 3),
                reason=reason,
            )
