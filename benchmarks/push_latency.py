"""Weight-push latency: the default model's full weights pushed to a running built-in server —
through a safetensors directory on disk (write + load), in memory over HTTP and through Ray's
object store (``weight_sync=object_store``: put, get, the staged file, load) — and, when a vLLM
interpreter is available (``AREAL_VLLM_PYTHON`` or ``.venv-vllm``) and asked for, to a vLLM
server. Part 2 of ``benchmarks/learner.py``, which runs it."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO

__all__ = ["push_latency"]


def _vllm_python() -> str | None:
    env = os.environ.get("AREAL_VLLM_PYTHON")
    if env and Path(env).is_file():
        return env
    local = REPO / ".venv-vllm" / "bin" / "python"
    return str(local) if local.is_file() else None


def _push_rounds(server: Any, model_dir: str, repeats: int, in_memory: bool) -> dict[str, Any]:
    """Push the model's own weights ``repeats`` times via disk (and in memory, and through
    Ray's object store, if supported)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from areal_agents.trainers.modeling import load_policy

    model = load_policy(Path(model_dir))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    size_mb = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
    config = AutoConfig.from_pretrained(model_dir)
    version = server.weight_version()
    disk, write, mem, store = [], [], [], []
    stages: list[dict[str, float]] = []
    loader = _shm_loader() if in_memory else None  # one staged file across pushes, as a run
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="areal-push-") as tmp:
        if loader is not None:
            stack.callback(loader.close)
        for i in range(repeats):
            target = Path(tmp) / f"v{i}"
            t0 = time.perf_counter()
            target.mkdir()
            save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
            config.save_pretrained(str(target))
            t1 = time.perf_counter()
            version += 1
            server.update_weights_from_disk(str(target), version, timeout=600)
            t2 = time.perf_counter()
            write.append(t1 - t0)
            disk.append(t2 - t0)
            if in_memory:
                version += 1
                t0 = time.perf_counter()
                server.update_weights_from_state_dict(state, version, timeout=600)
                mem.append(time.perf_counter() - t0)
                version += 1
                assert loader is not None
                seconds, stage = _object_store_push(loader, server, state, version)
                store.append(seconds)
                stages.append(stage)
    assert server.weight_version() == version, "the server did not report the pushed version"
    del torch
    out: dict[str, Any] = {
        "weights_mb": round(size_mb, 1),
        "disk_total_s": [round(x, 3) for x in disk],
        "disk_write_s": [round(x, 3) for x in write],
        "disk_median_s": round(statistics.median(disk), 3),
    }
    if mem:
        out["memory_s"] = [round(x, 3) for x in mem]
        out["memory_median_s"] = round(statistics.median(mem), 3)
    if store:
        out["object_store_s"] = [round(x, 3) for x in store]
        out["object_store_median_s"] = round(statistics.median(store), 3)
        out["object_store_stages_median_s"] = {
            key: round(statistics.median(s[key] for s in stages), 3) for key in stages[0]
        }
    return out


def _shm_loader() -> Any:
    from areal_agents.trainers.object_store import ShmLoader

    return ShmLoader()


def _object_store_push(
    loader: Any, server: Any, state: dict[str, Any], version: int
) -> tuple[float, dict[str, float]]:
    """Seconds of one ``weight_sync=object_store`` push, and of its stages: the learner's
    ``ray.put`` of its arrays (a Ray actor's return value goes through the same path), then,
    on the server's side (:class:`areal_agents.trainers.object_store.ShmLoader`), ``ray.get``,
    the copy into the staged file and the server's load."""
    import ray

    from areal_agents.trainers.object_store import to_arrays

    t0 = time.perf_counter()
    ref = ray.put(to_arrays(state))
    put_s = time.perf_counter() - t0
    loader.load([server], [ref], version, timeout=600)
    seconds = time.perf_counter() - t0
    del ref
    return seconds, {"put_s": put_s, **loader.last_seconds}


def push_latency(model: str, repeats: int, vllm: bool) -> dict[str, Any]:
    """Weight-push latency to the built-in server (and vLLM when asked and available)."""
    from areal_agents.serving.server import BuiltinServer
    from areal_agents.trainers.modeling import resolve_model_dir

    model_dir = str(resolve_model_dir(model))
    out: dict[str, Any] = {"model": model}
    from areal_agents.trainers.config import RayConfig
    from areal_agents.trainers.runtime import start_ray, stop_ray

    start_ray(RayConfig(num_cpus=1, object_store_mb=2048))  # a local instance on loopback
    try:
        with BuiltinServer(model_dir, served_model_name="policy") as server:
            server.wait_ready(timeout=600)
            out["builtin"] = _push_rounds(server, model_dir, repeats, in_memory=True)
    finally:
        stop_ray()
    b = out["builtin"]
    print(
        f"  built-in server: {b['weights_mb']} MB; via disk median {b['disk_median_s']} s "
        f"(of which writing {statistics.median(b['disk_write_s']):.3f} s); in memory over HTTP "
        f"median {b.get('memory_median_s')} s; through Ray's object store median "
        f"{b.get('object_store_median_s')} s (stages {b.get('object_store_stages_median_s')})",
        flush=True,
    )
    python = _vllm_python()
    if vllm and python:
        try:
            from areal_agents.serving.vllm import VLLMServer
        except ImportError as e:
            out["vllm"] = {"skipped": f"areal_agents.serving.vllm not importable: {e}"}
        else:
            os.environ.setdefault("AREAL_VLLM_PYTHON", python)
            t0 = time.perf_counter()
            with VLLMServer(model_dir, served_model_name="policy") as server:
                server.wait_ready(timeout=900)
                startup = time.perf_counter() - t0
                out["vllm"] = _push_rounds(server, model_dir, repeats, in_memory=False)
            out["vllm"]["startup_s"] = round(startup, 1)
            v = out["vllm"]
            print(f"  vLLM server: via disk median {v['disk_median_s']} s", flush=True)
    elif vllm:
        out["vllm"] = {"skipped": "no vLLM interpreter (.venv-vllm or AREAL_VLLM_PYTHON)"}
    return out
