"""vLLM's weight-transfer control plane against a fake server that records what it gets.

The fake answers the routes as vLLM's dev-mode router does (JSON bodies embedded under
``init_info`` / ``update_info`` / ``weight_version``); its ``/update_weights`` returns only once
the test's data plane has delivered, as vLLM's does once the broadcast has arrived. A fake
trainer engine stands in for vLLM's (which needs vLLM and, for its data plane, GPUs): it drives
the client as ``NCCLTrainerWeightTransferEngine.send_weights`` does. The real CPU server is in
``test_vllm_transfer_server.py``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from areal_agents.errors import WeightSyncError
from areal_agents.serving.vllm_transfer import (
    FanOutClient,
    PhaseTimeouts,
    TrainerTransfer,
    WeightTransferClient,
    server_world_size,
)


class FakeVLLM(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.calls: list[tuple[str, Any]] = []
        self.arrived = threading.Semaphore(0)  # one release per bucket the data plane sent
        self.hang: set[str] = set()
        self.routes = {
            "/init_weight_transfer_engine",
            "/start_weight_update",
            "/update_weights",
            "/finish_weight_update",
            "/shutdown_weight_transfer_engine",
        }
        self.world_size = 1
        self.fail: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    server: FakeVLLM

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path != "/get_world_size":
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"world_size": self.server.world_size}).encode())

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        if self.path not in self.server.routes:
            self.send_response(404)
            self.end_headers()
            return
        self.server.calls.append((self.path, body))
        if self.path in self.server.hang:
            threading.Event().wait(5)
        if self.path in self.server.fail:
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"worker failed")
            return
        if self.path == "/update_weights" and not self.server.arrived.acquire(timeout=5):
            self.send_response(500)  # the data never came
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    server = FakeVLLM()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.arrived.release()  # let a pending request end
    server.shutdown()
    server.server_close()


INFO = {"names": ["a.weight"], "dtype_names": ["bfloat16"], "shapes": [[4, 4]]}


class FakeEngine:
    """What vLLM's NCCL trainer engine does with its client, with a broadcast that completes
    only when the fake server takes the bucket (``delivered``) and otherwise waits forever."""

    def __init__(self, client: Any, fake: FakeVLLM, deliver: bool | None = True) -> None:
        self.client, self.fake, self.deliver = client, fake, deliver
        self.never = threading.Event()

    def send_weights(self) -> None:
        if self.deliver is None:
            self.never.wait()  # stuck before any call, e.g. in the learner ranks' gather
        self.client.start_weight_update()

        def receive() -> None:  # vLLM's engine holds the request in a future: so does this
            with contextlib.suppress(WeightSyncError):
                self.client.update_weights(INFO)

        update = threading.Thread(target=receive, daemon=True)
        update.start()
        if not self.deliver:
            self.never.wait()  # a broadcast whose peer never comes
        self.fake.arrived.release()  # the bucket arrived
        update.join()
        self.client.finish_weight_update()


def _calls(fake: FakeVLLM) -> list[str]:
    return [path for path, _ in fake.calls]


def test_the_client_speaks_vllms_routes_with_the_bodies_it_reads(fake: FakeVLLM) -> None:
    client = WeightTransferClient(fake.url)
    client.init_weight_transfer_engine({"master_port": 29600, "rank_offset": 1, "world_size": 2})
    client.start_weight_update()
    fake.arrived.release()
    client.update_weights(INFO)
    client.finish_weight_update("3")
    client.shutdown_weight_transfer_engine()
    assert _calls(fake) == [
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/shutdown_weight_transfer_engine",
    ]
    assert fake.calls[0][1] == {
        "init_info": {"master_port": 29600, "rank_offset": 1, "world_size": 2}
    }
    assert fake.calls[2][1] == {"update_info": INFO}
    assert fake.calls[3][1] == {"weight_version": "3"}
    fake.world_size = 4
    assert server_world_size(fake.url) == 4


def test_a_phase_that_hangs_fails_within_its_timeout_naming_it(fake: FakeVLLM) -> None:
    fake.hang.add("/start_weight_update")
    client = WeightTransferClient(fake.url, PhaseTimeouts(start_s=0.5))
    with pytest.raises(WeightSyncError, match=r"start \(/start_weight_update\).*0.5s"):
        client.start_weight_update()


def test_a_server_without_the_routes_says_how_to_start_it(fake: FakeVLLM) -> None:
    fake.routes = set()
    with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
        WeightTransferClient(fake.url).init_weight_transfer_engine({"packed": True})


def test_fan_out_puts_each_servers_workers_at_their_own_rank_offset() -> None:
    a, b = FakeVLLM(), FakeVLLM()
    for server in (a, b):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fan = FanOutClient([WeightTransferClient(a.url), WeightTransferClient(b.url)], [2, 1])
        assert fan.world_size == 4  # the trainer's sender, then 2 + 1 workers
        fan.init_weight_transfer_engine({"rank_offset": 1, "world_size": 2, "packed": True})
        assert a.calls[0][1]["init_info"] == {"rank_offset": 1, "world_size": 4, "packed": True}
        assert b.calls[0][1]["init_info"] == {"rank_offset": 3, "world_size": 4, "packed": True}
        fan.init_weight_transfer_engine({"packed": True})  # IPC: nothing to re-base
        assert b.calls[1][1]["init_info"] == {"packed": True}
        fan.version = 7  # vLLM's engines call finish without a version
        fan.finish_weight_update()
        assert a.calls[-1][1] == b.calls[-1][1] == {"weight_version": "7"}
        b.fail.add("/start_weight_update")
        with pytest.raises(WeightSyncError, match="HTTP 500"):
            fan.start_weight_update()
        assert fan.failed.is_set()
    finally:
        for server in (a, b):
            server.shutdown()
            server.server_close()


def _transfer(
    fake: FakeVLLM, timeouts: PhaseTimeouts, deliver: bool | None = True
) -> TrainerTransfer:
    transfer = TrainerTransfer("nccl", [fake.url], 0, source=None, timeouts=timeouts)
    transfer.engine = FakeEngine(transfer.client, fake, deliver)  # as init() would leave it
    return transfer


def _bounded(fn: Any) -> BaseException | None:
    """Run ``fn`` in a thread; the error it raised. Fails the test if it is still running
    after a minute (a hang), without asserting on how long it took otherwise."""
    out: list[BaseException | None] = [None]

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            out[0] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the weight transfer hung"
    return out[0]


def test_a_version_goes_through_every_phase_and_carries_its_number(fake: FakeVLLM) -> None:
    transfer = _transfer(fake, PhaseTimeouts())
    assert _bounded(lambda: transfer.send(5)) is None
    assert _calls(fake) == ["/start_weight_update", "/update_weights", "/finish_weight_update"]
    assert fake.calls[-1][1] == {"weight_version": "5"}


def test_a_server_that_fails_the_update_ends_the_push_while_the_data_plane_waits(
    fake: FakeVLLM,
) -> None:
    fake.fail.add("/update_weights")
    # a deadline far away: only noticing the server's failure ends the push before it
    transfer = _transfer(fake, PhaseTimeouts(start_s=600, update_s=600, finish_s=600), False)
    error = _bounded(lambda: transfer.send(2))
    assert isinstance(error, WeightSyncError) and "update (/update_weights)" in str(error)
    assert "/finish_weight_update" not in _calls(fake)


def test_a_data_plane_that_never_completes_fails_at_the_deadline(fake: FakeVLLM) -> None:
    transfer = _transfer(fake, PhaseTimeouts(start_s=0.5, update_s=0.5, finish_s=0.5), None)
    error = _bounded(lambda: transfer.send(2))
    assert isinstance(error, WeightSyncError)
    assert "did not finish within 1.5s" in str(error)


def test_a_send_before_the_rendezvous_is_an_error(fake: FakeVLLM) -> None:
    transfer = TrainerTransfer("ipc", [fake.url], 1, source=None, world_sizes=[1])
    with pytest.raises(WeightSyncError, match="init first"):
        transfer.send(1)
    with pytest.raises(ValueError, match="nccl or ipc"):
        TrainerTransfer("gloo", [fake.url], 1, source=None)  # type: ignore[arg-type]


def test_ipc_handles_travel_pickled_as_vllms_worker_reads_them(fake: FakeVLLM) -> None:
    import base64
    import pickle

    handles = [{"GPU-uuid": ("rebuild", (1, 2, 3))}]
    fake.arrived.release()
    WeightTransferClient(fake.url).update_weights({**INFO, "ipc_handles": handles})
    sent = fake.calls[-1][1]["update_info"]
    assert "ipc_handles" not in sent
    assert pickle.loads(base64.b64decode(sent["ipc_handles_pickled"])) == handles
    assert sent["names"] == INFO["names"]
