"""vLLM's weight-transfer data plane on CUDA: weights sent by a trainer process change what the
vLLM server generates, and the server serves the version the push named.

Needs a CUDA GPU and vLLM (not run on CPU-only machines). With two GPUs the trainer and the
server sit on different GPUs and the weights travel by NCCL broadcast; with one, the server
shares the trainer's GPU and they travel as CUDA IPC handles (``weight_sync=ipc``; NCCL cannot
put two ranks on one GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux semantics"),
]

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [1, 42, 7, 99, 300, 5]

TRAINER = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer import ModuleSource
    from areal_agents.net import free_port
    from areal_agents.serving.vllm_transfer import PhaseTimeouts, TrainerTransfer

    backend, url, model_dir = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():  # weights the server has never seen
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, device="cuda") * 0.05)
    transfer = TrainerTransfer(
        backend, [url], 0, ModuleSource(model), timeouts=PhaseTimeouts.within(300),
        bucket_bytes=4 << 20, master_port=free_port(),
    )
    transfer.init()
    transfer.send(1)
    ids = torch.tensor([PROMPT], device="cuda")
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    print("RESULT", json.dumps(out[0, len(PROMPT):].tolist()), flush=True)
    transfer.shutdown()
    """
).replace("PROMPT", repr(PROMPT))


def _greedy(server: object) -> list[int]:
    body = {"model": "policy", "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0}
    response = httpx.post(f"{server.base_url}/completions", json=body, timeout=120)  # type: ignore[attr-defined]
    response.raise_for_status()
    return list(response.json()["choices"][0]["token_ids"])


def test_weights_sent_by_the_trainer_are_what_vllm_generates_with() -> None:
    import torch

    from areal_agents.serving.vllm import VLLMServer
    from areal_agents.trainers.modeling import tiny_model_path
    from tests.conftest import vllm_python

    python = vllm_python()
    assert python is not None
    two = torch.cuda.device_count() >= 2
    backend = "nccl" if two else "ipc"
    server = VLLMServer(
        str(tiny_model_path()),
        python=str(python),
        served_model_name="policy",
        max_model_len=512,
        dtype="float32",
        extra_args=[
            "--weight-transfer-config", json.dumps({"backend": backend}),
            "--gpu-memory-utilization", "0.3",
        ],
    )  # fmt: skip
    server.extra_env = (
        {"CUDA_VISIBLE_DEVICES": "1"} if two else {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    )
    with server:
        server.wait_ready(timeout=600)
        before = _greedy(server)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "0"}
        done = subprocess.run(
            [str(python), "-c", TRAINER, backend, server.base_url, str(tiny_model_path())],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        expected = json.loads(done.stdout.split("RESULT", 1)[1])
        assert server.weight_version() == 1
        after = _greedy(server)
    assert after == expected  # the trainer's weights, as the trainer itself generates
    assert after != before
