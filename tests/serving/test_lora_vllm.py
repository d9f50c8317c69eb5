"""A LoRA adapter pushed to a real vLLM server at run time generates what the built-in server
generates after merging the same adapter onto its base (greedy tokens, close log-probs)."""

from __future__ import annotations

import sys

import httpx
import pytest
import torch

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux semantics"),
]

PROMPT = [1, 42, 7, 99, 300, 5]


def _adapter(r: int = 8) -> dict[str, torch.Tensor]:
    """A random adapter on q/k/v/o of the tiny model (PEFT names), strong enough to matter."""
    from torch import nn

    from areal_agents.serving.adapters import PEFT_PREFIX
    from areal_agents.trainers.modeling import load_policy, tiny_model_path

    g = torch.Generator().manual_seed(0)
    out = {}
    for name, module in load_policy(tiny_model_path()).named_modules():
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in (
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
        ):
            out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = (
                torch.randn(r, module.in_features, generator=g) * 0.3
            )
            out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = (
                torch.randn(module.out_features, r, generator=g) * 0.3
            )
    return out


def test_vllm_serves_a_pushed_adapter_like_the_builtin_server_merges_it() -> None:
    from areal_agents.serving.engine import Engine, GenerationRequest
    from areal_agents.serving.vllm import VLLMServer
    from areal_agents.trainers.modeling import tiny_model_path
    from tests.conftest import vllm_python

    python = vllm_python()
    assert python is not None  # the vllm marker skips the test without one
    adapter, scaling = _adapter(), 2.0
    engine = Engine(tiny_model_path())
    try:
        engine.update_adapter(adapter, scaling, 1)
        request = GenerationRequest(prompt_ids=PROMPT, max_tokens=6, temperature=0.0)
        expected = engine.submit(request).result(timeout=120)
    finally:
        engine.close()
    server = VLLMServer(
        str(tiny_model_path()),
        python=str(python),
        served_model_name="policy",
        max_model_len=512,
        dtype="float32",
        extra_args=["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"],
    )
    server.extra_env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with server:
        server.wait_ready(timeout=600)
        server.update_adapter(adapter, scaling, 1, timeout=300)
        assert server.weight_version() == 1
        body = {
            "model": server.adapter_name,
            "prompt": PROMPT,
            "max_tokens": 6,
            "temperature": 0.0,
            "logprobs": 0,
            "return_token_ids": True,
        }
        choice = httpx.post(f"{server.base_url}/completions", json=body, timeout=120).json()[
            "choices"
        ][0]
    assert choice["token_ids"] == expected.token_ids
    got = choice["logprobs"]["token_logprobs"]
    assert max(abs(a - b) for a, b in zip(got, expected.logprobs, strict=True)) < 1e-2
