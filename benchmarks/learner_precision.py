"""The learner's forward and backward in float32 against bf16 compute (``model.compute_dtype``).

``python benchmarks/learner_precision.py --threads 2``: SmolLM2-135M, a batch of 4 x 512 random
tokens, AdamW; prints the forward+backward and optimizer seconds of each step, alternating the
settings so that drift in the machine's load hits both.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from areal_agents.trainers.modeling import load_policy, resolve_model_dir
from areal_agents.trainers.precision import mixed_precision


def _step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor
) -> tuple[float, float]:
    start = time.perf_counter()
    logits = model(input_ids=ids).logits
    logits.float().log_softmax(-1).mean().backward()
    mid = time.perf_counter()
    opt.step()
    opt.zero_grad()
    return mid - start, time.perf_counter() - mid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model_dir(args.model)
    models = {
        "float32": load_policy(path),
        "bfloat16": mixed_precision(load_policy(path), "bfloat16", "cpu"),
    }
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-5) for k, m in models.items()}
    ids = torch.randint(0, 40000, (args.rows, args.seq_len))
    times: dict[str, list[list[float]]] = {k: [] for k in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            times[name].append([round(t, 2) for t in _step(model, opts[name], ids)])
    print(json.dumps({"threads": args.threads, "steps_fwd_bwd_opt_s": times}))


if __name__ == "__main__":
    main()
