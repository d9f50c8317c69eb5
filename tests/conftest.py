"""Shared test set-up: resource markers that skip when a resource is missing; model fixtures.

``docker``, ``bubblewrap``, ``vllm``, ``browser`` and ``gpu`` tests skip on a machine without the
resource. CI sets ``AREAL_REQUIRE_RESOURCES=1`` (``scripts/test.sh`` does): then a missing
resource (other than a GPU) is a failure, so that those tests run there and never skip into green.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

# Tests reach nothing but loopback: no model or dataset hub lookups, even by a library's default.
for _offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_offline, "1")

ROOT = Path(__file__).resolve().parent.parent
SANDBOX_IMAGE = os.environ.get("AREAL_SANDBOX_IMAGE", "areal-agents-sandbox:latest")


@functools.cache
def docker_status() -> str | None:
    """None when the engine answers and the sandbox image exists, else the reason."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as e:
        return f"no Docker engine answers ({type(e).__name__})"
    try:
        client.images.get(SANDBOX_IMAGE)
    except Exception:
        return f"image {SANDBOX_IMAGE} missing: python -m areal_agents.sandbox build"
    return None


@functools.cache
def bubblewrap_status() -> str | None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap not installed (apt-get install bubblewrap)"
    probe = subprocess.run(
        [bwrap, "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "true"],
        capture_output=True,
        timeout=20,
    )
    return None if probe.returncode == 0 else f"bwrap cannot create namespaces: {probe.stderr!r}"


def vllm_python() -> Path | None:
    """The interpreter of the vLLM environment (AREAL_VLLM_PYTHON, else .venv-vllm)."""
    candidate = os.environ.get("AREAL_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    return Path(candidate) if Path(candidate).exists() else None


@functools.cache
def vllm_status() -> str | None:
    return None if vllm_python() else "no vLLM environment (scripts/services.sh makes .venv-vllm)"


@functools.cache
def browser_status() -> str | None:
    return None if shutil.which("chromium") else "chromium not installed"


@functools.cache
def gpu_status() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU"


_CHECKS = {
    "docker": docker_status,
    "bubblewrap": bubblewrap_status,
    "vllm": vllm_status,
    "browser": browser_status,
    "gpu": gpu_status,
}


def pytest_runtest_setup(item: pytest.Item) -> None:
    require = os.environ.get("AREAL_REQUIRE_RESOURCES") == "1"
    for name, check in _CHECKS.items():
        if name not in item.keywords:
            continue
        reason = check()
        if reason is None:
            continue
        if require and name != "gpu":
            pytest.fail(f"required resource {name!r} is missing: {reason}", pytrace=False)
        pytest.skip(f"{name}: {reason}")


# ---- the offline default model, loaded once per session (policy and serving tests) ------


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from areal_agents.serving.model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir: Path) -> Any:
    """The default model in this process, for teacher-forced log-probabilities."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def teacher_forced_logprobs(model: Any, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, from one forward pass."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    return logprobs.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
