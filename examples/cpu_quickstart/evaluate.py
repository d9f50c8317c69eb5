"""Held-out success rate of a model on the calculator environment.

Starts the built-in server on the model directory, plays one episode per held-out task
(:func:`examples.cpu_quickstart.tasks.heldout_seeds`) through the token client — the same
episode loop as training — and reports the mean reward (= success rate), how often the model
called the tool, and the episode shape. ``--temperature 1.0`` samples as training does;
``--temperature 0`` is greedy.

    python -m examples.cpu_quickstart.evaluate --model runs/cpu_quickstart/warm_start --tasks 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["evaluate", "main"]


async def _play(
    base_url: str,
    tokenizer: Any,
    seeds: Sequence[int],
    temperature: float,
    max_tokens: int,
    concurrency: int,
    max_turns: int,
) -> list[dict[str, Any]]:
    from areal_agents.envs.registry import make_env
    from areal_agents.policies.token_client import TokenPolicy
    from areal_agents.rollout import run_episode

    policy = TokenPolicy(
        base_url,
        "policy",
        tokenizer,
        temperature=temperature,
        max_tokens=max_tokens,
        max_concurrency=concurrency,
        timeout=1800,
    )
    queue = list(seeds)
    rows: list[dict[str, Any]] = []

    async def lane() -> None:
        env = make_env("calculator", max_turns=max_turns)
        while queue:
            seed = queue.pop(0)
            episode = await run_episode(env, policy, seed=seed)
            row = episode.to_json()
            row["seed"] = seed
            row["used_tool"] = episode.tool_calls > 0
            rows.append(row)
        env.close()

    await asyncio.gather(*(lane() for _ in range(min(concurrency, len(queue)))))
    return sorted(rows, key=lambda r: r["seed"])


def evaluate(
    model: str | Path,
    *,
    tasks: int = 128,
    temperature: float = 1.0,
    max_tokens: int = 48,
    concurrency: int = 32,
    max_turns: int = 2,
    transcripts: str | Path | None = None,
) -> dict[str, Any]:
    """Success rate of ``model`` on ``tasks`` held-out calculator tasks."""
    from transformers import AutoTokenizer

    from areal_agents.policies.server import BuiltinServer
    from areal_agents.trainers.modeling import resolve_model_dir
    from examples.cpu_quickstart.tasks import heldout_seeds

    model_dir = resolve_model_dir(str(model))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    seeds = heldout_seeds(tasks)
    start = time.perf_counter()
    server = BuiltinServer(
        str(model_dir), served_model_name="policy", extra_args=["--max-batch-size", "64"]
    )
    with server:
        server.wait_ready(timeout=600)
        rows = asyncio.run(
            _play(
                server.base_url, tokenizer, seeds, temperature, max_tokens, concurrency, max_turns
            )
        )
    if transcripts:
        path = Path(transcripts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rewards = [float(r["reward"]) for r in rows]
    return {
        "model": str(model),
        "tasks": len(rows),
        "temperature": temperature,
        "max_tokens": max_tokens,
        "success": round(statistics.fmean(rewards), 4),
        "tool_call_rate": round(statistics.fmean(float(r["used_tool"]) for r in rows), 4),
        "turns_mean": round(statistics.fmean(r["num_turns"] for r in rows), 3),
        "policy_tokens_mean": round(statistics.fmean(r["num_policy_tokens"] for r in rows), 1),
        "truncated_frac": round(statistics.fmean(float(r["truncated"]) for r in rows), 4),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory, default or tiny")
    parser.add_argument("--tasks", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--transcripts", default=None, help="write episodes here (JSONL)")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    result = evaluate(
        args.model,
        tasks=args.tasks,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        transcripts=args.transcripts,
    )
    print(json.dumps(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
