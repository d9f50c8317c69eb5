"""vLLM's weight-transfer control plane against a fake server that records what it gets.

The fake answers the four routes as vLLM's dev-mode router does (JSON bodies embedded under
``init_info`` / ``update_info`` / ``weight_version``); its ``/update_weights`` returns only once
the test's data-plane ``send`` for that bucket has run, as vLLM's does once the broadcast has
arrived. It replaces the server only: the NCCL/IPC data plane needs GPUs and is not run here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from areal_agents.errors import WeightSyncError
from areal_agents.serving.vllm_transfer import (
    PhaseTimeouts,
    TensorSpec,
    WeightTransferClient,
    buckets,
    push_version,
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
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    server: FakeVLLM

    def log_message(self, *args: Any) -> None:
        pass

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
    server.shutdown()
    server.server_close()


SPECS = [
    TensorSpec("embed.weight", "bfloat16", (8, 4), 64),
    TensorSpec("layer.0.w", "bfloat16", (4, 4), 32),
    TensorSpec("layer.1.w", "bfloat16", (4, 4), 32),
    TensorSpec("norm.weight", "float32", (4,), 16),
]


def test_buckets_keep_order_and_bound_the_size() -> None:
    got = buckets(SPECS, bucket_bytes=64)
    assert [[s.name for s in b] for b in got] == [
        ["embed.weight"],
        ["layer.0.w", "layer.1.w"],
        ["norm.weight"],
    ]
    assert [len(b) for b in buckets(SPECS, bucket_bytes=10)] == [1, 1, 1, 1]  # big: alone


def test_the_phases_run_in_order_with_the_bodies_vllm_reads(fake: FakeVLLM) -> None:
    client = WeightTransferClient(fake.url)
    client.init_engine(
        {"master_address": "127.0.0.1", "master_port": 29600, "rank_offset": 1, "world_size": 2}
    )
    sent: list[int] = []

    def send(index: int, bucket: Any) -> None:
        sent.append(index)
        fake.arrived.release()  # the data plane delivered this bucket

    push_version(client, 3, buckets(SPECS, bucket_bytes=64), send)
    routes = [path for path, _ in fake.calls]
    assert routes == [
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/update_weights",
        "/update_weights",
        "/update_weights",
        "/finish_weight_update",
    ]
    assert fake.calls[0][1]["init_info"]["world_size"] == 2
    assert fake.calls[3][1]["update_info"] == {
        "names": ["layer.0.w", "layer.1.w"],
        "dtype_names": ["bfloat16", "bfloat16"],
        "shapes": [[4, 4], [4, 4]],
    }
    assert fake.calls[-1][1] == {"weight_version": "3"}
    assert sent == [0, 1, 2]


def test_a_phase_that_hangs_fails_within_its_timeout_naming_it(fake: FakeVLLM) -> None:
    fake.hang.add("/start_weight_update")
    client = WeightTransferClient(fake.url, PhaseTimeouts(start_s=0.5))
    with pytest.raises(WeightSyncError, match=r"start \(/start_weight_update\).*0.5s"):
        push_version(client, 1, buckets(SPECS, 64), lambda i, b: None)
    assert not any(path == "/update_weights" for path, _ in fake.calls)


def test_a_bucket_whose_data_never_arrives_is_an_error(fake: FakeVLLM) -> None:
    client = WeightTransferClient(fake.url, PhaseTimeouts(update_s=10))
    with pytest.raises(WeightSyncError, match="update"):
        push_version(client, 1, buckets(SPECS, 64), lambda i, b: None)  # sends nothing
    assert "/finish_weight_update" not in [path for path, _ in fake.calls]


def test_a_failing_send_stops_the_version_before_finish(fake: FakeVLLM) -> None:
    def send(index: int, bucket: Any) -> None:
        raise RuntimeError("NCCL error: unhandled system error")

    client = WeightTransferClient(fake.url)
    with pytest.raises(WeightSyncError, match=r"sending bucket 0 of version 2.*NCCL"):
        push_version(client, 2, buckets(SPECS, 64), send)
    fake.arrived.release()  # let the pending request end
    assert "/finish_weight_update" not in [path for path, _ in fake.calls]


def test_a_server_without_the_routes_says_how_to_start_it(fake: FakeVLLM) -> None:
    fake.routes = set()
    with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
        WeightTransferClient(fake.url).init_engine({"packed": False})
