"""Learner speed and weight-push latency.

1. **Time per trained token**: the same batch of synthetic trajectories trained by
   * ``plain``  — single-process torch: forward, token log-probs, the GRPO loss from
     ``trainers.algorithms``, backward, clipping, AdamW; no process group, no sharding;
   * ``fsdp1``  — the project's :class:`~areal_agents.trainers.learner.Learner`, FSDP2, 1 rank;
   * ``fsdp2``  — the same Learner, FSDP2 over 2 ranks (gloo on CPU, NCCL on GPU).
   Each runs in a fresh process with all the machine's cores (split evenly over ranks). Printed:
   seconds per step, microseconds per trained token, and the FSDP/plain ratios (target: 2 ranks
   within 1.15x of plain torch).
2. **Weight push**: the default model's full weights pushed to a running built-in server —
   through a safetensors directory on disk (write + load), in memory over HTTP and through Ray's
   object store (``weight_sync=object_store``: put, get, shared memory, load) — and, when a
   vLLM interpreter is available (``AREAL_VLLM_PYTHON`` or ``.venv-vllm``) and
   ``--vllm`` is given, to a vLLM server.

    python benchmarks/learner.py --json benchmarks/results/learner.json
    python benchmarks/learner.py --model tiny --rows 4 --seq-len 64 --steps 1 --no-push   # smoke

3. **LoRA** (``--lora R``): full fine-tuning against LoRA rank ``R`` — peak memory, optimizer
   state, step and push time (``benchmarks/learner_lora.py``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine_info, write_json

__all__ = ["main", "synthetic_batch"]


def synthetic_batch(
    rows: int, seq_len: int, vocab: int, group_size: int = 4, seed: int = 0
) -> list[Any]:
    """Trajectories of random tokens: the first third prompt (mask 0), the rest policy tokens."""
    import random

    from areal_agents.types import Trajectory

    rng = random.Random(seed)
    out = []
    for i in range(rows):
        n = seq_len - rng.randrange(0, max(1, seq_len // 8))  # ragged, as real batches are
        prompt = n // 3
        mask = [0] * prompt + [1] * (n - prompt)
        out.append(
            Trajectory(
                sequence_ids=tuple(rng.randrange(vocab) for _ in range(n)),
                loss_mask=tuple(mask),
                behavior_logprobs=tuple(-2.0 * m for m in mask),
                versions=tuple(0 if m else -1 for m in mask),
                reward=float(rng.random() < 0.5),
                group_id=f"g{i // group_size}",
                task_id=f"t{i // group_size}",
            )
        )
    return out


def _spec(model_dir: str, rank: int, world: int, micro_batch_tokens: int) -> Any:
    from areal_agents.trainers.algorithms import AlgoConfig
    from areal_agents.trainers.config import ModelConfig, TrainerConfig
    from areal_agents.trainers.learner import LearnerSpec

    trainer = TrainerConfig(lr=1e-6, groups_per_step=1, micro_batch_tokens=micro_batch_tokens)
    return LearnerSpec(
        model_dir=model_dir,
        algo=AlgoConfig.from_name("grpo"),
        trainer=trainer,
        model=ModelConfig(name=model_dir),
        temperature=1.0,
        rank=rank,
        world_size=world,
        use_gpu=_gpu(),
    )


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _plain(model_dir: str, batch: list[Any], steps: int, micro_batch_tokens: int) -> list[float]:
    """Single-process torch: the same model, loss and optimizer, without FSDP."""
    import torch

    from areal_agents.trainers.algorithms import (
        AlgoConfig,
        compute_advantages,
        compute_policy_loss,
    )
    from areal_agents.trainers.batching import collate, plan, sequence_logprobs
    from areal_agents.trainers.modeling import load_policy

    device = torch.device("cuda" if _gpu() else "cpu")
    model = load_policy(Path(model_dir)).to(device)
    algo = AlgoConfig.from_name("grpo")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    pad = int(getattr(model.config, "pad_token_id", None) or 0)
    data = collate(batch, pad)
    mbs = plan(list(range(len(batch))), data.lengths, 1, 0, micro_batch_tokens)
    adv, _ = compute_advantages(algo, data.rewards, data.loss_mask, data.group_ids)
    norm = float((data.loss_mask.sum(1) > 0).sum())
    times = []
    for _ in range(steps + 1):  # the first step warms up allocators and kernels
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for rows in mbs:
            mb = data.rows(rows)
            w = mb.loss_mask.shape[1]
            ids = mb.sequence_ids.to(device)
            logits = model(input_ids=ids, attention_mask=mb.attention_mask.to(device)).logits
            lp = sequence_logprobs(logits, ids, 1.0)
            lp = torch.nn.functional.pad(lp, (0, w - lp.shape[1]))
            mask = mb.loss_mask.to(device)
            loss, _ = compute_policy_loss(
                algo,
                lp,
                lp.detach(),
                mb.behavior_logprobs.to(device),
                adv[rows, :w].to(device),
                mask,
                normalizer=norm,
            )
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times[1:]


def _rank(
    rank: int,
    world: int,
    port: int,
    model_dir: str,
    batch: list[Any],
    steps: int,
    micro_batch_tokens: int,
    threads: int,
    out: Any,
) -> None:
    import torch

    torch.set_num_threads(threads)
    if world == 0:  # plain torch
        out.put(("plain", _plain(model_dir, batch, steps, micro_batch_tokens)))
        return
    from areal_agents.trainers.learner import Learner

    if _gpu():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    learner = Learner(_spec(model_dir, rank, world, micro_batch_tokens))
    learner.setup("127.0.0.1", port)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        learner.train_step(batch)
        if _gpu():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    learner.shutdown()
    if rank == 0:
        out.put((f"fsdp{world}", times[1:]))


def time_per_token(
    model_dir: str,
    batch: list[Any],
    steps: int,
    micro_batch_tokens: int,
    configs: Sequence[str] = ("plain", "fsdp1", "fsdp2"),
) -> dict[str, Any]:
    """Seconds per step of each configuration, each in fresh processes."""
    from areal_agents.net import free_port

    cores = os.cpu_count() or 1
    trained = sum(t.num_policy_tokens for t in batch)
    total = sum(len(t.sequence_ids) for t in batch)
    ctx = mp.get_context("spawn")
    results: dict[str, Any] = {}
    for name in configs:
        world = 0 if name == "plain" else int(name.removeprefix("fsdp"))
        threads = max(1, cores // max(1, world))
        queue = ctx.Queue()
        port = free_port()
        procs = [
            ctx.Process(
                target=_rank,
                args=(r, world, port, model_dir, batch, steps, micro_batch_tokens, threads, queue),
            )
            for r in range(max(1, world))
        ]
        start = time.perf_counter()
        for p in procs:
            p.start()
        label, times = queue.get(timeout=3600)
        for p in procs:
            p.join(timeout=120)
        step_s = statistics.median(times)
        results[label] = {
            "ranks": world,
            "threads_per_rank": threads,
            "step_s": [round(t, 3) for t in times],
            "median_step_s": round(step_s, 3),
            "us_per_trained_token": round(1e6 * step_s / trained, 1),
            "us_per_token": round(1e6 * step_s / total, 1),
            "wall_s": round(time.perf_counter() - start, 1),
        }
        print(
            f"  {label:6s} ranks={max(1, world)} threads/rank={threads}: median step "
            f"{step_s:7.2f} s  {results[label]['us_per_trained_token']:8.1f} us/trained token"
            f"  (steps {results[label]['step_s']})",
            flush=True,
        )
    base = results.get("plain", {}).get("median_step_s")
    ratios = {}
    for label, row in results.items():
        if label != "plain" and base:
            ratios[f"{label}_vs_plain"] = round(row["median_step_s"] / base, 3)
    return {
        "rows": len(batch),
        "tokens": total,
        "trained_tokens": trained,
        "configs": results,
        "ratios": ratios,
    }


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
    with tempfile.TemporaryDirectory(prefix="areal-push-") as tmp:
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
                store.append(_object_store_push(server, state, version))
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
    return out


def _object_store_push(server: Any, state: dict[str, Any], version: int) -> float:
    """Seconds of one ``weight_sync=object_store`` push: the learner's ``ray.put`` of its
    arrays (a Ray actor's return value goes through the same path), then the server side's
    ``ray.get``, the shared-memory copy and the server's load
    (:func:`areal_agents.trainers.object_store.push_ref`)."""
    import ray

    from areal_agents.trainers.object_store import push_ref, to_arrays

    t0 = time.perf_counter()
    ref = ray.put(to_arrays(state))
    push_ref(server, [ref], version, timeout=600)
    seconds = time.perf_counter() - t0
    del ref
    return seconds


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
        f"{b.get('object_store_median_s')} s",
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


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="default, tiny or a model directory")
    parser.add_argument("--rows", type=int, default=8, help="trajectories per batch")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    parser.add_argument("--configs", default="plain,fsdp1,fsdp2")
    parser.add_argument("--push-repeats", type=int, default=3)
    parser.add_argument("--no-push", action="store_true")
    parser.add_argument("--vllm", action="store_true", help="also push to a vLLM server")
    parser.add_argument(
        "--lora", type=int, default=0, help="also compare full fine-tuning with LoRA of this rank"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from transformers import AutoConfig

    from areal_agents.trainers.modeling import resolve_model_dir

    model_dir = str(resolve_model_dir(args.model))
    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    batch = synthetic_batch(args.rows, args.seq_len, vocab)
    result: dict[str, Any] = {"benchmark": "learner", "machine": machine_info(), "args": vars(args)}
    print(
        f"time per trained token (model={args.model}, {args.rows} rows x ~{args.seq_len} tokens, "
        f"micro-batch {args.micro_batch_tokens} tokens, GRPO loss, AdamW):",
        flush=True,
    )
    configs = [c for c in args.configs.split(",") if c]
    result["train"] = time_per_token(model_dir, batch, args.steps, args.micro_batch_tokens, configs)
    for key, ratio in result["train"]["ratios"].items():
        target = " (target <= 1.15)" if key == "fsdp2_vs_plain" else ""
        print(f"  ratio {key}: {ratio}x{target}")
    if not args.no_push:
        print(f"weight push latency (model={args.model}, {args.push_repeats} pushes):", flush=True)
        result["push"] = push_latency(args.model, args.push_repeats, args.vllm)
    if args.lora:
        from learner_lora import compare

        print(f"full fine-tuning vs LoRA r={args.lora} (model={args.model}):", flush=True)
        result["lora"] = compare(
            args.model, args.lora, args.rows, args.seq_len, args.steps, args.push_repeats
        )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
