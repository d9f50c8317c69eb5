"""Full fine-tuning against LoRA on the learner: memory, optimizer state, step and push time.

Each configuration runs in a fresh process (one FSDP2 rank, all the machine's cores): it builds
the project's :class:`~areal_agents.trainers.learner.Learner` (``model.lora.r=0`` or ``R``),
trains the same synthetic batch ``steps + 1`` times (the first is a warm-up) and pushes its
weights to one running built-in server: the full model through a safetensors directory (the
trainer's default, ``--full-push disk``) or as a state dict in memory over HTTP
(``--full-push state_dict``), or, with LoRA, only the adapter (``/update_weights?scaling=``,
merged onto the server's base). Printed and
saved: peak resident memory of the learner process, trainable parameters, optimizer state bytes,
median step seconds, median push seconds and the pushed payload's bytes.

    python benchmarks/learner_lora.py --model tiny --json benchmarks/results/learner_lora.json
    python benchmarks/learner_lora.py --model default --lora 16 --steps 2 \
        --json benchmarks/results/learner_lora_default.json
    python benchmarks/learner.py --lora 8 ...      # the same, from the learner benchmark
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
from _common import machine_info, write_json

__all__ = ["compare", "main"]


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "numel"))


def _run(
    model_dir: str,
    r: int,
    batch: list[Any],
    steps: int,
    pushes: int,
    base_url: str,
    first_version: int,
    port: int,
    out: Any,
    full_push: str = "state_dict",
) -> None:
    import resource

    import torch

    from areal_agents.serving.server import BuiltinServerClient
    from areal_agents.trainers.algorithms import AlgoConfig
    from areal_agents.trainers.config import LoraConfig, ModelConfig, TrainerConfig
    from areal_agents.trainers.learner import Learner, LearnerSpec

    torch.set_num_threads(os.cpu_count() or 1)
    spec = LearnerSpec(
        model_dir=model_dir,
        algo=AlgoConfig.from_name("grpo"),
        trainer=TrainerConfig(lr=1e-6, groups_per_step=1, micro_batch_tokens=1024),
        model=ModelConfig(name=model_dir, lora=LoraConfig(r=r, alpha=2.0 * r if r else 16.0)),
        temperature=1.0,
        rank=0,
        world_size=1,
    )
    learner = Learner(spec)
    info = learner.setup("127.0.0.1", port)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        learner.train_step(batch)
        times.append(time.perf_counter() - t0)
    optimizer_bytes = _nbytes(
        t for state in learner.optimizer.state.values() for t in state.values() if t.ndim > 0
    )
    client = BuiltinServerClient(base_url)
    push_s, payload = [], 0
    for i in range(pushes):
        t0 = time.perf_counter()
        if learner.lora is not None:
            adapter = learner.adapter_state()
            client.update_adapter(adapter, learner.lora.scaling, first_version + i, timeout=600)
            payload = _nbytes(adapter.values())
        elif full_push == "disk":
            with tempfile.TemporaryDirectory(prefix="learner-lora-") as tmp:
                learner.export_weights(tmp)
                client.update_weights_from_disk(tmp, first_version + i, timeout=600)
                payload = sum(f.stat().st_size for f in Path(tmp).glob("*.safetensors"))
        else:
            state = learner.full_state()
            state.pop("lm_head.weight", None)  # tied: the server shares it with the embedding
            client.update_weights_from_state_dict(state, first_version + i, timeout=600)
            payload = _nbytes(state.values())
        push_s.append(time.perf_counter() - t0)
    learner.shutdown()
    out.put(
        {
            "lora_r": r,
            "push": "adapter" if r else full_push,
            "params": info["params"],
            "trainable_params": info["trainable_params"],
            "optimizer_state_mb": round(optimizer_bytes / 2**20, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "step_s": [round(x, 3) for x in times[1:]],
            "median_step_s": round(statistics.median(times[1:]), 3),
            "push_s": [round(x, 3) for x in push_s],
            "median_push_s": round(statistics.median(push_s), 3),
            "push_payload_mb": round(payload / 2**20, 3),
        }
    )


def compare(
    model: str,
    r: int,
    rows: int,
    seq_len: int,
    steps: int,
    pushes: int,
    full_push: str = "state_dict",
    settings: Sequence[str] = ("full", "lora"),
) -> dict[str, Any]:
    """Full fine-tuning (``r=0``) and LoRA rank ``r``, each in a fresh process (``settings``:
    which of the two run)."""
    from learner import synthetic_batch
    from transformers import AutoConfig

    from areal_agents.net import free_port
    from areal_agents.serving.server import BuiltinServer
    from areal_agents.trainers.modeling import resolve_model_dir

    model_dir = str(resolve_model_dir(model))
    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    batch = synthetic_batch(rows, seq_len, vocab)
    ctx = mp.get_context("spawn")
    configs: dict[str, Any] = {}
    with BuiltinServer(model_dir, served_model_name="policy") as server:
        server.wait_ready(timeout=600)
        chosen = [
            (n, label, rank)
            for n, (label, rank) in enumerate((("full", 0), (f"lora_r{r}", r)))
            if label.split("_")[0] in settings
        ]
        for n, label, rank in chosen:
            queue = ctx.Queue()
            args = (model_dir, rank, batch, steps, pushes, server.base_url)
            proc = ctx.Process(
                target=_run, args=(*args, 1 + 100 * n, free_port(), queue, full_push)
            )
            proc.start()
            configs[label] = queue.get(timeout=1800)
            proc.join(timeout=60)
            row = configs[label]
            print(
                f"  {label:>8}: trainable {row['trainable_params']:>10,} of {row['params']:,}  "
                f"optimizer {row['optimizer_state_mb']:9.3f} MB  peak RSS {row['peak_rss_mb']:7.1f}"
                f" MB  step {row['median_step_s']:6.3f} s  push {row['median_push_s']:6.3f} s "
                f"({row['push_payload_mb']:.3f} MB)",
                flush=True,
            )
    ratios = {}
    if len(configs) == 2:
        full, lora = configs["full"], configs[f"lora_r{r}"]
        ratios = {
            key: round(lora[key] / full[key], 4) if full[key] else None
            for key in ("optimizer_state_mb", "peak_rss_mb", "median_step_s", "median_push_s")
        }
        print(f"  lora/full: {ratios}", flush=True)
    return {
        "model": model,
        "rows": rows,
        "seq_len": seq_len,
        "full_push": full_push,
        "configs": configs,
        "ratios": ratios,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="default, tiny or a model directory")
    parser.add_argument("--lora", type=int, default=8, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument(
        "--full-push",
        choices=("disk", "state_dict"),
        default="state_dict",
        help="how full fine-tuning pushes: a safetensors directory (the trainer's default) "
        "or its state dict over HTTP",
    )
    parser.add_argument("--settings", default="full,lora", help="which to run: full, lora")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    print(
        f"full fine-tuning vs LoRA r={args.lora} (model={args.model}, {args.rows} rows x "
        f"~{args.seq_len} tokens, 1 FSDP2 rank, GRPO, AdamW):",
        flush=True,
    )
    result = {"benchmark": "learner_lora", "machine": machine_info(), "args": vars(args)}
    result.update(
        compare(
            args.model,
            args.lora,
            args.rows,
            args.seq_len,
            args.steps,
            args.pushes,
            args.full_push,
            args.settings.split(","),
        )
    )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
