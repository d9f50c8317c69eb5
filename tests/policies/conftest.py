"""The serving engines the client tests run against: the built-in server and real vLLM
(``vllm`` marker), each started once per module that asks for ``server``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest


@pytest.fixture(
    scope="module",
    params=["builtin", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])],
)
def server(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "builtin":
        from areal_agents.serving.server import BuiltinServer
        from areal_agents.trainers.inference import thread_env
        from areal_agents.trainers.inference_config import InferenceConfig

        handle: Any = BuiltinServer(max_model_len=2048)
        # one torch thread, as the trainer runs it (inference.torch_threads=1): a server using
        # every core slows to a crawl when the tests beside it take a core
        handle.extra_env = thread_env(InferenceConfig(torch_threads=1))
        timeout = 180.0
    else:
        from areal_agents.serving.vllm import VLLMServer
        from tests.conftest import vllm_python

        python = vllm_python()
        if python is None:  # conftest has skipped (or failed) the test already
            pytest.skip("no vLLM environment")
        handle = VLLMServer(python=str(python), max_model_len=2048, dtype="float32")
        timeout = 600.0
    handle.kind = request.param
    handle.start()
    try:
        handle.wait_ready(timeout=timeout)
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
