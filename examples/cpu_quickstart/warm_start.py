"""A short supervised warm-start ("cold start") on generated tool-use demonstrations.

SmolLM2-135M-Instruct's own chat template has no tools: prompted with the project's tool
template it answers in prose and never emits a ``<tool_call>``. A few supervised steps on
correct demonstrations (prompt -> ``<tool_call>`` -> tool result -> ``\\boxed{N}``) teach the
format. The warm-start is kept deliberately short, so that the model succeeds only sometimes:
the improvement measured afterwards comes from RL, not from this step.

By default a fraction of the demonstrations (``--direct-frac``, 0.5) answer straight away with
the correct number and no tool call, as a cold-start set collected without care for tool use
would. The warm-started model then does both; a direct answer is a guess (a 135M model cannot
multiply two-digit numbers in its head) and almost always wrong. What RL has to learn is the
decision the demonstrations left open: call the tool.

Demonstrations are rendered with the same chat template the server and the learner use, and the
loss covers exactly the assistant tokens (what the policy samples, up to and including
``<|im_end|>``).

    python -m examples.cpu_quickstart.warm_start --out runs/cpu_quickstart/warm_start
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_agents.trainers.warm_start import encode_demonstration

__all__ = ["encode_demonstration", "main", "warm_start"]


def warm_start(
    out: str | Path,
    *,
    model: str = "default",
    demos: int = 128,
    direct_frac: float = 0.5,
    steps: int = 8,
    batch_size: int = 8,
    lr: float = 2e-5,
    seed: int = 0,
    threads: int | None = None,
    max_questions: int = 1,
) -> dict[str, Any]:
    """Fine-tune ``model`` on ``demos`` demonstrations for ``steps`` steps; save to ``out``.

    ``max_questions`` above 1 makes each demonstration a dialogue of 1 to ``max_questions``
    calculator questions (uniformly), as the async-vs-sync benchmark's long-tail workload asks
    them; each question is answered directly with probability ``direct_frac``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_agents.trainers.modeling import resolve_model_dir
    from examples.cpu_quickstart.tasks import dialogue, warm_start_seeds

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    source = resolve_model_dir(model)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy: Any = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    policy.to(device)
    policy.train()
    pick = random.Random(seed + 2)
    sizes = [pick.randint(1, max_questions) for _ in range(demos)]
    seeds = warm_start_seeds(sum(sizes))
    questions = len(seeds)
    direct = set(random.Random(seed + 1).sample(range(questions), round(direct_frac * questions)))
    data, first = [], 0
    for k in sizes:
        asked = range(first, first + k)
        data.append(
            encode_demonstration(
                tokenizer, *dialogue([seeds[i] for i in asked], [i not in direct for i in asked])
            )
        )
        first += k
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        if len(order) < batch_size:
            more = list(range(len(data)))
            rng.shuffle(more)
            order += more
        rows = [data[order.pop()] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in rows)
        pad = int(tokenizer.pad_token_id or 0)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row_ids, row_mask) in enumerate(rows):
            n = len(row_ids)
            ids[i, :n] = torch.tensor(row_ids)
            attn[i, :n] = 1
            mask[i, :n] = torch.tensor(row_mask, dtype=torch.bool)
        ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
        # the LM head only where a target token is trained (saves most of the logits' memory)
        hidden = policy.model(input_ids=ids, attention_mask=attn).last_hidden_state
        where = mask[:, 1:]  # predict token t+1 from position t
        logits = policy.lm_head(hidden[:, :-1][where]).float()
        loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:][where])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        losses.append(round(float(loss), 4))
        print(f"warm-start step {step + 1}/{steps}: loss {losses[-1]:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    target = Path(out)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.to("cpu").save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    template = source / "chat_template.jinja"
    if template.is_file():  # the project's tool template travels with the weights
        shutil.copy(template, tmp / "chat_template.jinja")
    info = {
        "source": str(model),
        "demos": demos,
        "direct_frac": direct_frac,
        "max_questions": max_questions,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "losses": losses,
        "train_s": round(elapsed, 1),
    }
    (tmp / "warm_start.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return info


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/cpu_quickstart/warm_start")
    parser.add_argument("--model", default="default")
    parser.add_argument("--demos", type=int, default=128)
    parser.add_argument("--direct-frac", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-questions", type=int, default=1, help="questions per demonstration dialogue, 1-K"
    )
    args = parser.parse_args(argv)
    info = warm_start(
        args.out,
        model=args.model,
        demos=args.demos,
        direct_frac=args.direct_frac,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        max_questions=args.max_questions,
    )
    print(json.dumps({k: v for k, v in info.items() if k != "losses"}))
    return info


if __name__ == "__main__":
    main()
