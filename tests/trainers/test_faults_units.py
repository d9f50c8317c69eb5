"""The parts of a restart, without Ray: a worker that pauses hands its groups back and goes on
on new servers; a push passes over a server that died and a restarted one is reloaded with the
newest version without the learners; the supervision's restart budget (``ray.max_restarts``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from areal_agents.errors import AgentsError, WeightSyncError
from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.trainers.config import EnvConfig, InferenceConfig
from areal_agents.trainers.rollout_worker import LocalBuffer, RolloutWorker
from areal_agents.trainers.supervisor import FaultLog, Supervisor
from areal_agents.trainers.weight_sync import WeightSync
from areal_agents.types import Message, ToolSpec, Turn


class GatedPolicy:
    """Answers once ``gate`` is set (a server that hangs, then dies); counts its calls."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.calls = 0

    async def act(self, conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> Turn:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        return Turn(
            text="\\boxed{0}",
            completion_ids=(7,),
            behavior_logprobs=(-0.5,),
            versions=(0,),
            prompt_ids=(1, 2),
            finish_reason="stop",
        )


def test_a_paused_worker_hands_its_groups_back_and_goes_on_on_new_servers() -> None:
    buffer = TrajectoryBuffer(groups_per_step=2, max_staleness=0, total_groups=4)
    dead = GatedPolicy(asyncio.Event())  # never answers: its server is gone
    worker = RolloutWorker(
        EnvConfig(name="calculator", group_size=2),
        [dead],
        LocalBuffer(buffer),
        max_concurrent_groups=2,
        worker_id=5,
    )

    async def main() -> tuple[list[int], list[int]]:
        task = asyncio.create_task(worker.run(poll_s=0.01))
        while dead.calls < 4:  # both groups' episodes are waiting on the dead server
            await asyncio.sleep(0.01)
        assert sorted(buffer._holder.values()) == ["5:0.0/", "5:0.0/"]
        requeued = await worker.pause()
        assert buffer.pending() == [0, 1] and not buffer._inflight  # back, not lost
        worker.resume([GatedPolicy()])  # the restarted server
        trained: list[int] = []
        while len(trained) < 4:
            batch = buffer.pop_batch()
            if batch is None:
                await asyncio.sleep(0.01)
                continue
            trained += [g.task.index for g in batch]
            buffer.set_version(buffer.version + 1)
        worker.stop()
        await asyncio.wait_for(task, 30)
        return requeued, trained

    requeued, trained = asyncio.run(main())
    assert sorted(requeued) == [0, 1]
    assert sorted(trained) == [0, 1, 2, 3]  # the handed-back tasks trained once, none lost
    assert worker.stats.abandoned_groups == 2
    assert buffer.counters["requeued_groups"] == 2
    assert worker.holder == "5:0.1/"  # a new name after the pause
    assert not worker._envs  # the cancelled episodes' environments were closed


class FakeLearners:
    def __init__(self) -> None:
        self.calls = 0

    def export_weights(self, directory: Path) -> None:
        self.calls += 1
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_text("weights")


class FakeServer:
    def __init__(self, dead: bool = False) -> None:
        self.dead = dead
        self.version = 0
        self.base_url = "http://127.0.0.1:1/v1"

    def alive(self) -> bool:
        return not self.dead

    def update_weights_from_disk(self, path: str, version: int, timeout: float) -> None:
        if self.dead:
            raise WeightSyncError("/update_weights_from_disk failed: ConnectError")
        self.version = version

    def weight_version(self) -> int:
        if self.dead:
            raise WeightSyncError("/weight_info failed: ConnectError")
        return self.version


def test_a_push_passes_over_a_dead_server_and_its_replacement_is_reloaded(
    tmp_path: Path,
) -> None:
    healthy, dying = FakeServer(), FakeServer()
    servers: list[Any] = [healthy, dying]
    sync = WeightSync(InferenceConfig(), servers, tmp_path, alive=lambda s: s.alive())
    learners = FakeLearners()
    sync.push(learners, 1)
    dying.dead = True  # kill -9 between two pushes
    served: list[int] = []
    sync.start(learners, 2, on_served=served.append).wait()  # no WeightSyncError
    assert healthy.version == 2 and served == [2]
    assert sync.served_versions == [2, 1]  # the dead one still counts as what it served
    servers[1] = FakeServer()  # the supervisor's restart, in the list the push shares
    assert sync.reload([1]) == 2  # the newest version, without the learners
    assert servers[1].version == 2 and learners.calls == 2
    assert sync.served_versions == [2, 2]
    sync.close()


def test_without_the_liveness_check_a_dead_server_fails_the_push(tmp_path: Path) -> None:
    sync = WeightSync(InferenceConfig(), [FakeServer(dead=True)], tmp_path)
    with pytest.raises(WeightSyncError, match="ConnectError"):
        sync.push(FakeLearners(), 1)
    sync.close()


def test_vllm_transfer_refuses_to_reload_a_restarted_server(tmp_path: Path) -> None:
    cfg = InferenceConfig(engine="vllm", weight_sync="nccl")
    sync = WeightSync(cfg, [FakeServer()], tmp_path)
    with pytest.raises(WeightSyncError, match="weight_sync=disk or object_store"):
        sync.reload([0])
    sync.close()


@pytest.mark.parametrize(("max_restarts", "allowed"), [(0, 0), (2, 2)])
def test_max_restarts_bounds_the_restarts_of_each_kind(
    tmp_path: Path, max_restarts: int, allowed: int
) -> None:
    supervisor = Supervisor(
        servers=[],
        sync=None,  # type: ignore[arg-type]
        buffer=None,
        placement=None,  # type: ignore[arg-type]
        start_server=lambda i: None,  # type: ignore[arg-type, return-value]
        start_worker=lambda i, n, urls: None,
        workers=[],
        runs=[],
        max_restarts=max_restarts,
        faults=FaultLog(tmp_path),
        step=lambda: 3,
    )
    for _ in range(allowed):
        supervisor._budget("server", "inference server 0")
    if allowed:  # each kind is counted apart
        supervisor._budget("rollout_worker", "rollout worker 0")
    with pytest.raises(AgentsError, match=rf"ray.max_restarts={max_restarts}.*re-run"):
        supervisor._budget("server", "inference server 0")


def test_the_fault_log_counts_restarts_across_resumes(tmp_path: Path) -> None:
    FaultLog(tmp_path).record("server", index=0, step=2, restart_s=1.5)
    log = FaultLog(tmp_path)  # the run resumed: the log is read back
    log.record("learner", step=4, restart_s=9.0)
    assert log.counts() == {"server": 1, "rollout_worker": 0, "learner": 1}
    assert [e["kind"] for e in log.events] == ["server", "learner"]
