"""Learner speed and weight-push latency.

1. **Time per trained token**: the same batch of synthetic trajectories trained by
   * ``plain``  — single-process torch: forward, token log-probs, the GRPO loss from
     ``trainers.algorithms``, backward, clipping, AdamW; no process group, no sharding;
   * ``fsdp1``  — the project's :class:`~areal_agents.trainers.learner.Learner`, FSDP2, 1 rank;
   * ``fsdp2``  — the same Learner, FSDP2 over 2 ranks (gloo on CPU, NCCL on GPU).
   Each runs in a fresh process with all the machine's cores (split evenly over ranks). Printed:
   seconds per step, microseconds per trained token, and the FSDP/plain ratios (target: 2 ranks
   within 1.15x of plain torch).
2. **Weight push** (``push_latency.py``): the default model's full weights pushed to a running
   built-in server — through a safetensors directory on disk, in memory over HTTP and through
   Ray's object store — and, with ``--vllm`` and a vLLM interpreter, to a vLLM server.

    python benchmarks/learner.py --json benchmarks/results/learner.json
    python benchmarks/learner.py --model tiny --rows 4 --seq-len 64 --steps 1 --no-push   # smoke

3. **LoRA** (``--lora R``): full fine-tuning against LoRA rank ``R`` — peak memory, optimizer
   state, step and push time (``benchmarks/learner_lora.py``).
4. **The shared prompt prefix** (``--workload code --share both``): batches as the code
   environment makes them (:func:`code_batch`: the rendered system prompt, tool schemas and
   task, ~330 tokens of which every episode shares, then the reply) trained by the Learner with
   ``trainer.share_prompt_prefix`` on (``fsdp1``) and off (``fsdp1_noshare``)::

    python benchmarks/learner.py --workload code --rows 16 --micro-batch-tokens 2048 \
        --threads 1 --configs fsdp1 --share both --no-push --json results/learner_shared_prefix.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, write_json
from push_latency import push_latency

__all__ = ["code_batch", "main", "synthetic_batch"]


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


_WORDS = ("the", "function", "returns", "a", "list", "value", "loop", "each", "case", "first")


def code_batch(rows: int, model_dir: str, group_size: int = 4, seed: int = 0) -> list[Any]:
    """Code-environment episodes as the learner gets them: the prompt the model's chat template
    renders (system prompt, tool schemas, the task: ~400 tokens, the first ~330 the same for
    every task) and a one-turn reply (a sentence of 0-40 words, then the task's own solution in
    a fenced block, closing the turn) as the policy tokens; ``group_size`` episodes per task."""
    import random

    from transformers import AutoTokenizer

    from areal_agents.envs.code_sandbox import CodeSandboxEnv
    from areal_agents.envs.tasks.code import ProceduralCodeTasks
    from areal_agents.policies.templates import render_prompt_ids
    from areal_agents.types import Trajectory

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    tasks = ProceduralCodeTasks()
    env = CodeSandboxEnv(sandbox_backend="process")
    rng = random.Random(seed)
    out = []
    try:
        for g in range((rows + group_size - 1) // group_size):
            obs, info = env.reset(seed=seed * 100_003 + g)
            prompt = render_prompt_ids(tokenizer, obs, info["tools"])
            solution = tasks.get(info["task_id"]).metadata["canonical_solution"]
            for _ in range(min(group_size, rows - len(out))):
                words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 40)))
                reply = f"{words}\n```python\n{solution}```<|im_end|>"
                completion = list(tokenizer.encode(reply, add_special_tokens=False))
                mask = [0] * len(prompt) + [1] * len(completion)
                out.append(
                    Trajectory(
                        sequence_ids=tuple(prompt + completion),
                        loss_mask=tuple(mask),
                        behavior_logprobs=tuple(-1.0 * m for m in mask),
                        versions=tuple(0 if m else -1 for m in mask),
                        reward=float(rng.random() < 0.5),
                        group_id=f"g{g}",
                        task_id=info["task_id"],
                    )
                )
    finally:
        env.close()
    return out


def batch_shape(batch: list[Any]) -> dict[str, Any]:
    """Lengths, and the prefix every row shares (up to the first policy token)."""
    first = min(t.loss_mask.index(1) if 1 in t.loss_mask else len(t.loss_mask) for t in batch)
    ids = [t.sequence_ids for t in batch]
    shared = 0
    while shared < first and all(len(x) > shared and x[shared] == ids[0][shared] for x in ids):
        shared += 1
    lengths = [len(x) for x in ids]
    return {
        "rows": len(batch),
        "min_len": min(lengths),
        "max_len": max(lengths),
        "mean_len": round(statistics.fmean(lengths), 1),
        "shared_prefix": shared,
        "mean_rest": round(statistics.fmean(n - shared for n in lengths), 1),
    }


def _spec(
    model_dir: str, rank: int, world: int, micro_batch_tokens: int, share: bool = True
) -> Any:
    from areal_agents.trainers.algorithms import AlgoConfig
    from areal_agents.trainers.config import ModelConfig, TrainerConfig
    from areal_agents.trainers.learner import LearnerSpec

    trainer = TrainerConfig(
        lr=1e-6,
        groups_per_step=1,
        micro_batch_tokens=micro_batch_tokens,
        share_prompt_prefix=share,
    )
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
    share: bool = True,
) -> None:
    import torch

    torch.set_num_threads(threads)
    if world == 0:  # plain torch
        out.put(("plain", _plain(model_dir, batch, steps, micro_batch_tokens), {}))
        return
    from areal_agents.trainers.learner import Learner

    if _gpu():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    learner = Learner(_spec(model_dir, rank, world, micro_batch_tokens, share))
    learner.setup("127.0.0.1", port)
    times = []
    metrics: dict[str, float] = {}
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        metrics = learner.train_step(batch)
        if _gpu():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    learner.shutdown()
    if rank == 0:
        label = f"fsdp{world}" + ("" if share else "_noshare")
        out.put((label, times[1:], metrics))


def time_per_token(
    model_dir: str,
    batch: list[Any],
    steps: int,
    micro_batch_tokens: int,
    configs: Sequence[str] = ("plain", "fsdp1", "fsdp2"),
    threads: int | None = None,
    share: Sequence[bool] = (True,),
) -> dict[str, Any]:
    """Seconds per step of each configuration, each in fresh processes: ``threads`` torch
    threads per rank (default: the machine's cores split over the ranks); the FSDP ones with
    ``trainer.share_prompt_prefix`` set to each of ``share`` (off: ``fsdpN_noshare``)."""
    from areal_agents.net import free_port

    cores = os.cpu_count() or 1
    trained = sum(t.num_policy_tokens for t in batch)
    total = sum(len(t.sequence_ids) for t in batch)
    ctx = mp.get_context("spawn")
    results: dict[str, Any] = {}
    runs = [(n, s) for n in configs for s in (share if n != "plain" else (True,))]
    for name, shared in runs:
        world = 0 if name == "plain" else int(name.removeprefix("fsdp"))
        per_rank = threads or max(1, cores // max(1, world))
        queue = ctx.Queue()
        port = free_port()
        args = (port, model_dir, batch, steps, micro_batch_tokens, per_rank, queue, shared)
        procs = [ctx.Process(target=_rank, args=(r, world, *args)) for r in range(max(1, world))]
        start, load = time.perf_counter(), os.getloadavg()[0]
        for p in procs:
            p.start()
        label, times, metrics = queue.get(timeout=3600)
        for p in procs:
            p.join(timeout=120)
        step_s = statistics.median(times)
        results[label] = {
            "ranks": world,
            "threads_per_rank": per_rank,
            "step_s": [round(t, 3) for t in times],
            "median_step_s": round(step_s, 3),
            "us_per_trained_token": round(1e6 * step_s / trained, 1),
            "us_per_token": round(1e6 * step_s / total, 1),
            "trained_tokens_per_s": round(trained / step_s, 2),
            "tokens_per_s": round(total / step_s, 2),
            "wall_s": round(time.perf_counter() - start, 1),
            "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)],  # at start and end
        }
        if "learner/forward_tokens" in metrics:
            results[label]["forward_tokens"] = metrics["learner/forward_tokens"]
        print(
            f"  {label:13s} ranks={max(1, world)} threads/rank={per_rank}: median step "
            f"{step_s:7.2f} s  {results[label]['us_per_trained_token']:8.1f} us/trained token"
            f"  {results[label]['tokens_per_s']:7.1f} tokens/s"
            f"  forward tokens {results[label].get('forward_tokens', '-')}"
            f"  (steps {results[label]['step_s']})",
            flush=True,
        )
    base = results.get("plain", {}).get("median_step_s")
    ratios = {}
    for label, row in results.items():
        if label != "plain" and base and not label.endswith("_noshare"):
            ratios[f"{label}_vs_plain"] = round(row["median_step_s"] / base, 3)
        padded = results.get(f"{label}_noshare")
        if padded:
            ratios[f"{label}_share_vs_noshare"] = round(
                row["median_step_s"] / padded["median_step_s"], 3
            )
    return {
        "rows": len(batch),
        "tokens": total,
        "trained_tokens": trained,
        "configs": results,
        "ratios": ratios,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="default, tiny or a model directory")
    parser.add_argument("--rows", type=int, default=8, help="trajectories per batch")
    parser.add_argument(
        "--workload",
        choices=("synthetic", "code"),
        default="synthetic",
        help="synthetic: random tokens (--seq-len); code: code-environment episodes sharing "
        "their rendered system prompt and tool schemas (code_batch)",
    )
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads per rank (default: all cores)"
    )
    parser.add_argument(
        "--share",
        choices=("on", "off", "both"),
        default="on",
        help="trainer.share_prompt_prefix of the FSDP configurations (both: each twice)",
    )
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
    if args.workload == "code":
        batch = code_batch(args.rows, model_dir)
    else:
        vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
        batch = synthetic_batch(args.rows, args.seq_len, vocab)
    shape = batch_shape(batch)
    result: dict[str, Any] = {"benchmark": "learner", "machine": machine_info(), "args": vars(args)}
    print(
        f"time per trained token (model={args.model}, {args.workload} batch: {shape}, "
        f"micro-batch {args.micro_batch_tokens} tokens, GRPO loss, AdamW):",
        flush=True,
    )
    configs = [c for c in args.configs.split(",") if c]
    share = {"on": (True,), "off": (False,), "both": (True, False)}[args.share]
    result["train"] = time_per_token(
        model_dir, batch, args.steps, args.micro_batch_tokens, configs, args.threads, share
    )
    result["train"]["batch"] = shape
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
