"""A non-streaming request whose client has gone stops generating.

A client that times out and retries would otherwise leave its first request decoding to the end
for nobody, beside the retry: under load that feedback fills the batch with abandoned rows until
no request finishes within its timeout (seen: an evaluation of 16 concurrent episodes that
finished none in nine minutes). The server here is the real application on the tiny model, in
this process, so the engine's own results can be read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import pytest

from areal_agents.net import free_port


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Any, str, list[Future[Any]]]]:
    import uvicorn

    from areal_agents.serving.api import create_app
    from areal_agents.serving.engine import Engine
    from areal_agents.trainers.modeling import tiny_model_path

    engine = Engine(tiny_model_path(), max_batch_size=4)
    futures: list[Future[Any]] = []
    submit = engine.submit
    engine.submit = lambda r: futures.append(submit(r)) or futures[-1]  # type: ignore[method-assign]
    port = free_port()
    config = uvicorn.Config(
        create_app(engine, "tiny"), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield engine, url, futures
    server.should_exit = True
    thread.join(timeout=30)
    engine.close()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_request_whose_client_timed_out_is_aborted(
    served: tuple[Any, str, list[Future[Any]]], route: str
) -> None:
    _, url, futures = served
    futures.clear()
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 1900, "ignore_eos": True}
    if route == "/v1/completions":
        body["prompt"] = "Once upon a time"
    else:
        body["messages"] = [{"role": "user", "content": "Tell me a story."}]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + route, json=body, timeout=httpx.Timeout(5.0, read=0.3))
    assert len(futures) == 1
    result = futures[0].result(timeout=60)  # resolved soon after the client left
    assert result.finish_reason == "abort"
    assert len(result.token_ids) < 1900


def test_a_request_the_client_waits_for_runs_to_the_end(
    served: tuple[Any, str, list[Future[Any]]],
) -> None:
    _, url, futures = served
    futures.clear()
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 40, "ignore_eos": True}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert futures[0].result(timeout=1).finish_reason == "length"


def test_a_request_cancelled_while_queued_is_never_prefilled(
    served: tuple[Any, str, list[Future[Any]]],
) -> None:
    from areal_agents.serving.engine import GenerationRequest

    engine, _, futures = served
    futures.clear()
    request = GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=50, ignore_eos=True)
    request.cancelled = True
    result = engine.submit(request).result(timeout=60)
    assert result.finish_reason == "abort" and result.token_ids == []
