"""A token's weight version comes from the server with the response, not from a read the client
makes when the response arrives.

vLLM's side is the launcher's ASGI middleware, run here around a small vLLM-like completions
app in-process (the real CPU vLLM server carries it in ``test_vllm_transfer_server.py``); the
built-in server sends the same headers itself.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request

from areal_agents.net import free_port
from areal_agents.policies import versions
from areal_agents.policies.token_client import TokenPolicy
from areal_agents.policies.versions import END_HEADER, START_HEADER, response_version
from areal_agents.serving import version_headers
from areal_agents.serving.version_headers import WeightVersionMiddleware
from areal_agents.types import Message


class Served:
    """The version a fake vLLM serves, and whether it is paused; a completion can land an
    update mid-generation (``bump_during``)."""

    def __init__(self) -> None:
        self.version = 3
        self.paused = False
        self.bump_during = False
        self.aborted = threading.Event()  # set by the server's thread

    async def get(self) -> str:
        return str(self.version)

    async def is_paused(self) -> bool:
        return self.paused

    def finish_update(self, version: int) -> None:
        """The update lands, then generation resumes (vLLM's order)."""
        self.version = version
        self.paused = False


def _vllm_like(served: Served) -> Any:
    """``/v1/completions`` as vLLM answers it: token ids and log-probs, no version in the body."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        if served.bump_during:
            served.version += 1  # an update lands while this generation runs
        n = int(body["max_tokens"])
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "text": "x" * n,
                    "token_ids": [42] * n,
                    "logprobs": {"token_logprobs": [-0.5] * n, "tokens": ["x"] * n},
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter() -> dict[str, str]:
        return {"status": "loaded"}

    @app.post("/pause")
    async def pause() -> dict[str, str]:
        # vLLM's order: the aborted requests are answered first, the pause flag set after
        served.aborted.set()
        await asyncio.sleep(0.3)
        served.paused = True
        return {"status": "paused"}

    return WeightVersionMiddleware(app, version=served.get, paused=served.is_paused)


@contextmanager
def _serving(app: Any) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the app did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_response_that_spans_an_update_is_tagged_with_the_older_version(
    tokenizer: Any,
) -> None:
    served = Served()
    with _serving(_vllm_like(served)) as url:
        policy = TokenPolicy(
            url,
            "policy",
            tokenizer,
            max_tokens=4,
            max_model_len=512,
            version_source=lambda: 99,  # the client's own counter has moved on: never asked
        )
        served.bump_during = True
        turn = asyncio.run(policy.act([Message.user("hi")], []))
        assert served.version == 4  # the update landed during the request...
        assert turn.versions == (3, 3, 3, 3)  # ...its tokens count as the version they started
        served.bump_during = False
        turn = asyncio.run(policy.act([Message.user("hi")], []))
        assert turn.versions == (4, 4, 4, 4)


def test_a_request_arriving_while_paused_waits_and_starts_under_the_new_version() -> None:
    served = Served()
    served.paused = True

    async def scenario(url: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"model": "policy", "prompt": [1], "max_tokens": 2}
            request = asyncio.create_task(client.post(f"{url}/completions", json=body))
            health = await client.get(url.removesuffix("/v1") + "/health")
            assert health.status_code == 200  # only generation requests are held
            await asyncio.sleep(0.3)
            assert not request.done()  # held while paused
            served.finish_update(5)
            return await request

    with _serving(_vllm_like(served)) as url:
        response = asyncio.run(scenario(url))
    assert response.headers[START_HEADER] == response.headers[END_HEADER] == "5"
    assert response_version(response.headers) == 5


def test_a_request_sent_between_vllms_abort_and_its_pause_flag_is_held() -> None:
    """vLLM answers the requests a pause aborts before it sets its paused flag: a client that
    continues at once must still be held, from the moment ``/pause`` arrived."""
    served = Served()

    async def scenario(url: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as client:
            root = url.removesuffix("/v1")
            pause = asyncio.create_task(client.post(f"{root}/pause", params={"mode": "abort"}))
            while not served.aborted.is_set():  # the abort is out; vLLM's flag is not set yet
                await asyncio.sleep(0.01)
            assert not served.paused
            body = {"model": "policy", "prompt": [1], "max_tokens": 2}
            request = asyncio.create_task(client.post(f"{url}/completions", json=body))
            assert (await pause).status_code == 200
            await asyncio.sleep(0.2)
            assert not request.done()  # held across the gap, then by the flag
            served.finish_update(4)
            return await request

    with _serving(_vllm_like(served)) as url:
        response = asyncio.run(scenario(url))
    assert response.headers[START_HEADER] == response.headers[END_HEADER] == "4"


def test_an_adapter_load_during_a_pause_is_not_held() -> None:
    """A LoRA push loads its adapter while the engine is paused: holding that request until the
    resume, which comes after it, deadlocked every push to vLLM."""
    served = Served()
    served.paused = True

    async def scenario(url: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"lora_name": "policy-lora", "lora_path": "/nowhere", "load_inplace": True}
            return await asyncio.wait_for(client.post(f"{url}/load_lora_adapter", json=body), 5)

    with _serving(_vllm_like(served)) as url:
        response = asyncio.run(scenario(url))
    assert response.status_code == 200 and response.json() == {"status": "loaded"}
    assert served.paused  # answered while still paused


def test_the_builtin_server_sends_the_same_headers(model_dir: Path) -> None:
    from areal_agents.serving.api import create_app
    from areal_agents.serving.engine import Engine

    engine = Engine(str(model_dir))
    try:

        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=create_app(engine, "policy"))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                body = {"model": "policy", "prompt": [1, 2], "max_tokens": 2, "temperature": 0.0}
                return await client.post("/v1/completions", json=body)

        response = asyncio.run(call())
    finally:
        engine.close()
    assert response.status_code == 200
    version = engine.weight_version
    assert response.headers[START_HEADER] == response.headers[END_HEADER] == str(version)
    assert response.json()["weight_version"] == version


def test_the_body_version_wins_then_the_older_header() -> None:
    both = {START_HEADER: "3", END_HEADER.lower(): "4"}
    assert response_version(both) == 3
    assert response_version(both, body_version=4) == 4  # the exact one, when a server knows it
    assert response_version({END_HEADER: "default"}) == 0  # vLLM before any update
    assert response_version({}) is None
    assert response_version({START_HEADER: "junk"}) is None


def test_the_middleware_stands_alone_for_vllms_interpreter(model_dir: Path) -> None:
    source = Path(str(version_headers.__file__))
    imported = {
        node.module or ""
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.ImportFrom)
    } | {
        alias.name
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not any(name.startswith("areal_agents") for name in imported)
    assert (version_headers.START_HEADER, version_headers.END_HEADER) == (
        versions.START_HEADER,
        versions.END_HEADER,
    )
    from areal_agents.serving.vllm import VERSION_MIDDLEWARE, VLLMServer

    server = VLLMServer(str(model_dir), python="python3")
    assert VERSION_MIDDLEWARE in server.command()
    where = server.environment()["PYTHONPATH"].split(":")[0]
    module, _, name = VERSION_MIDDLEWARE.rpartition(".")
    spec = importlib.util.spec_from_file_location(module, Path(where) / f"{module}.py")
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert callable(getattr(copy, name))
