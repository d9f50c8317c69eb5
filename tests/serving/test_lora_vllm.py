"""LoRA on a real vLLM server, started as a LoRA training run starts it
(:mod:`areal_agents.serving.vllm_lora`): the adapter's name serves the base until the first push;
an adapter pushed by the trainer's :class:`WeightSync` gives the learner's greedy tokens and
log-probs; the next push replaces it (never adds to it)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from areal_agents.trainers.config import InferenceConfig, LoraConfig
from areal_agents.trainers.modeling import tiny_model_path

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux semantics"),
]

PROMPT = [1, 42, 7, 99, 300, 5]
TOKENS = 6
LORA = LoraConfig(r=8, alpha=16.0)  # q, k, v, o


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from areal_agents.serving.vllm import VLLMServer
    from areal_agents.serving.vllm_lora import launch_args
    from tests.conftest import vllm_python

    python = vllm_python()
    assert python is not None  # the vllm marker skips the module without one
    flags, name = launch_args(
        tiny_model_path(),
        tmp_path_factory.mktemp("lora-base"),
        "policy",
        r=LORA.r,
        alpha=LORA.alpha,
        target_modules=LORA.target_modules,
    )
    vllm = VLLMServer(
        str(tiny_model_path()),
        python=str(python),
        served_model_name="policy",
        max_model_len=512,
        dtype="float32",
        extra_args=flags,
    )
    assert vllm.adapter_name == name
    with vllm:
        vllm.wait_ready(timeout=600)
        yield vllm


def _complete(server: Any, model: str) -> tuple[list[int], list[float]]:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": TOKENS,
        "temperature": 0.0,
        "logprobs": 0,
        "return_token_ids": True,
    }
    response = httpx.post(f"{server.base_url}/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"])


def _learner_model(seed: int | None) -> Any:
    """The tiny model with the learner's LoRA layers; ``seed``: random, strong adapter weights
    (None: as initialised, ``lora_B`` zero)."""
    from areal_agents.trainers.lora import apply_lora
    from areal_agents.trainers.modeling import load_policy

    model = load_policy(tiny_model_path())
    apply_lora(model, LORA)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if ".lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=g) * 0.3)
    return model.eval()


def _greedy(model: Any) -> tuple[list[int], list[float]]:
    """The learner's own greedy continuation of PROMPT and the log-prob of each token."""
    ids, logprobs = list(PROMPT), []
    with torch.no_grad():
        for _ in range(TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return ids[len(PROMPT) :], logprobs


class _Learners:
    """What :class:`WeightSync` asks of the learner group for an adapter push."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def adapter_state(self) -> dict[str, torch.Tensor]:
        from areal_agents.trainers.lora import adapter_state

        return adapter_state(self.model)


def _close(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_the_adapter_name_serves_the_base_until_the_first_push(server: Any) -> None:
    base_tokens, base_logprobs = _complete(server, "policy")
    tokens, logprobs = _complete(server, server.adapter_name)
    assert tokens == base_tokens
    assert _close(logprobs, base_logprobs) < 1e-4
    expected_tokens, expected_logprobs = _greedy(_learner_model(None))  # B = 0: the base
    assert tokens == expected_tokens
    assert _close(logprobs, expected_logprobs) < 1e-2
    assert server.weight_version() == 0


def test_pushed_adapters_give_the_learners_policy_and_replace_each_other(
    server: Any, tmp_path: Path
) -> None:
    from areal_agents.trainers.weight_sync import WeightSync

    sync = WeightSync(InferenceConfig(), [server], tmp_path, lora=LORA)
    base = _complete(server, "policy")
    served = []
    for version, seed in ((1, 0), (2, 1)):
        model = _learner_model(seed)
        sync.push(_Learners(model), version)
        assert sync.served_versions == [version]
        tokens, logprobs = _complete(server, server.adapter_name)
        expected_tokens, expected_logprobs = _greedy(model)
        assert tokens == expected_tokens  # the learner's own greedy tokens
        assert _close(logprobs, expected_logprobs) < 1e-2
        served.append((tokens, logprobs))
    assert served[0] != served[1]  # the second adapter replaced the first
    # the base stays served under its own name, untouched by the pushes
    tokens, logprobs = _complete(server, "policy")
    assert tokens == base[0] and _close(logprobs, base[1]) < 1e-4
    assert served[0][0] != base[0] or _close(served[0][1], base[1]) > 1e-2
