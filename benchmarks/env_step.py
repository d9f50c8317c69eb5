"""Environment overhead and rollout throughput.

Two figures:

1. **Step overhead** of a registered environment (``gym.make`` with its wrappers), without a
   tool call: ``env.step`` on a final answer, which parses, scores and returns. Also a step that
   parses and runs one in-process tool call, and ``reset``. Target: under 1 ms per step.
2. **Rollout throughput** against the built-in inference server as the number of concurrent
   episodes grows (1, 2, 4, ...): episodes/s and generated tokens/s, until the server saturates
   (the next doubling gains less than ``--saturation-gain``). ``--prefix-cache-mb 0`` runs the
   server without prefix caching; each level reports the share of prompt tokens the server
   took from its prefix cache instead of prefilling them.

    python benchmarks/env_step.py                        # default model, full sweep
    python benchmarks/env_step.py --model tiny --concurrency 1,2,4 --episodes 8   # smoke run
    python benchmarks/env_step.py --env code_sandbox --skip-overhead --concurrency 1,4,16 \
        --max-tokens 80 --temperature 0 --saturation-gain -1 --prefix-cache-mb 0  # no cache

Figures are printed and, with ``--json PATH``, written as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import latency, machine_info, write_json

from areal_agents.cpus import pin_process
from areal_agents.envs.registry import make_env
from areal_agents.rollout import run_episode
from areal_agents.types import Turn

__all__ = ["main", "rollout_sweep", "step_overhead"]


def step_overhead(env_name: str = "calculator", steps: int = 2000) -> dict[str, Any]:
    """Time ``reset``, a final-answer ``step`` and a one-tool-call ``step`` of ``env_name``."""
    env = make_env(env_name)
    resets: list[float] = []
    finals: list[float] = []
    tools: list[float] = []
    answer = Turn(text="I computed it. The answer is \\boxed{42}.")
    for i in range(steps):
        t0 = time.perf_counter()
        env.reset(seed=i)
        t1 = time.perf_counter()
        resets.append(t1 - t0)
        task = env.unwrapped.task  # type: ignore[attr-defined]
        expression = (task.metadata or {}).get("expression", "1+1")
        if i % 2 == 0:  # a final answer: parse (no tool call), score, terminate
            t0 = time.perf_counter()
            env.step(answer)
            finals.append(time.perf_counter() - t0)
        else:  # one tool call parsed from text, validated, run in-process
            call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
            t0 = time.perf_counter()
            env.step(Turn(text=f"<tool_call>\n{call}\n</tool_call>"))
            tools.append(time.perf_counter() - t0)
    env.close()
    return {
        "env": env_name,
        "reset": latency(resets, "us", 1),
        "step_final_answer": latency(finals, "us", 1),
        "step_with_tool_call": latency(tools, "us", 1),
    }


async def _level(
    env_name: str,
    env_kwargs: dict[str, Any],
    policy: Any,
    concurrency: int,
    episodes: int,
    seed0: int,
) -> dict[str, Any]:
    envs = [make_env(env_name, **env_kwargs) for _ in range(concurrency)]
    seeds = iter(range(seed0, seed0 + episodes))
    tokens = turns = done = prompt_tokens = 0
    durations: list[float] = []

    async def lane(env: Any) -> None:
        nonlocal tokens, turns, done, prompt_tokens
        for seed in seeds:
            episode = await run_episode(env, policy, seed=seed)
            tokens += sum(len(t.completion_ids or ()) for t in episode.turns)
            prompt_tokens += sum(len(t.prompt_ids or ()) for t in episode.turns)
            turns += episode.num_turns
            done += 1
            durations.append(episode.duration_s)

    start = time.perf_counter()
    await asyncio.gather(*(lane(e) for e in envs))
    wall = time.perf_counter() - start
    for env in envs:
        env.close()
    return {
        "concurrency": concurrency,
        "episodes": done,
        "requests": turns,
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "wall_s": round(wall, 3),
        "episodes_per_s": round(done / wall, 3),
        "tokens_per_s": round(tokens / wall, 2),
        "episode_latency_s": round(statistics.fmean(durations), 3),
    }


def rollout_sweep(
    model: str = "default",
    env_name: str = "calculator",
    concurrency: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    episodes: int = 0,
    max_tokens: int = 48,
    saturation_gain: float = 0.10,
    server_log: str | None = None,
    prefix_cache_mb: float | None = None,
    temperature: float = 1.0,
    engine: str = "builtin",
    server_cpus: tuple[int, ...] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    server_threads: int | None = None,
) -> dict[str, Any]:
    """Episodes/s and tokens/s at each concurrency against one server of ``engine``
    (``builtin`` or ``vllm``, on ``server_cpus``: all cores when None).

    ``episodes`` per level (0: ``max(2 * concurrency, 8)``). The sweep stops after the first
    level that gains less than ``saturation_gain`` over the best before it.
    ``prefix_cache_mb`` is the built-in server's ``--prefix-cache-mb`` (None: its default);
    ``temperature`` 0 makes the episodes greedy (the same work in two runs); ``env_kwargs``
    (default ``max_turns=2``) go to every environment.
    """
    from transformers import AutoTokenizer

    from areal_agents.policies.token_client import TokenPolicy
    from areal_agents.serving.engines import get_engine
    from areal_agents.trainers.modeling import resolve_model_dir

    model_dir = resolve_model_dir(model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    max_batch = max(concurrency)
    extra: list[str] = []
    if engine == "builtin":
        extra = ["--max-batch-size", str(max_batch)]
        if prefix_cache_mb is not None:
            extra += ["--prefix-cache-mb", str(prefix_cache_mb)]
    server = get_engine(engine).server_class()(
        str(model_dir), served_model_name="policy", extra_args=extra, log_path=server_log
    )
    server.cpus = server_cpus
    if engine == "builtin" and server_threads is not None:
        server.extra_env = {"OMP_NUM_THREADS": str(server_threads)}
    builtin = engine == "builtin"  # its /weight_version carries the engine's counters
    levels: list[dict[str, Any]] = []
    saturated_at = None
    with server:
        t0 = time.perf_counter()
        server.wait_ready(timeout=600)
        startup = time.perf_counter() - t0
        policy = TokenPolicy(
            server.base_url,
            "policy",
            tokenizer,
            max_tokens=max_tokens,
            temperature=temperature,
            max_concurrency=max_batch,
            timeout=900,
        )
        env_kwargs = env_kwargs if env_kwargs is not None else {"max_turns": 2}
        # one warm-up episode (first-request costs are not throughput)
        asyncio.run(_level(env_name, env_kwargs, policy, 1, 1, 10**6))
        best = 0.0
        for c in concurrency:
            n = episodes or max(2 * c, 8)
            before = _server_stats(server.root_url) if builtin else {}
            row = asyncio.run(_level(env_name, env_kwargs, policy, c, n, 1000 * c))
            after = _server_stats(server.root_url) if builtin else {}
            row["engine"] = _engine_delta(before, after)
            row["prefix_cache"] = _prefix_delta(
                before.get("prefix_cache") or {}, after.get("prefix_cache") or {}
            )
            gain = row["tokens_per_s"] / best - 1 if best else None
            row["gain_vs_best_before"] = None if gain is None else round(gain, 3)
            levels.append(row)
            print(
                f"  concurrency {c:3d}: {row['episodes']:4d} episodes in {row['wall_s']:7.1f} s"
                f"  {row['episodes_per_s']:6.2f} ep/s  {row['tokens_per_s']:8.1f} tok/s"
                f"  latency {row['episode_latency_s']:.2f} s"
                + (f"  gain {gain:+.0%}" if gain is not None else "")
                + f"  prompt tokens from cache {row['prefix_cache'].get('reused_share', 0):.0%}"
                + f"  engine CPU s: prefill {row['engine'].get('prefill_cpu_s', 0):.1f}"
                + f" decode {row['engine'].get('decode_cpu_s', 0):.1f}",
                flush=True,
            )
            if gain is not None and gain < saturation_gain:
                saturated_at = c
                break
            best = max(best, row["tokens_per_s"])
    peak = max(levels, key=lambda r: r["tokens_per_s"])
    return {
        "model": model,
        "engine": engine,
        "server_cpus": list(server_cpus) if server_cpus is not None else None,
        "server_threads": server_threads,
        "env": env_name,
        "max_tokens": max_tokens,
        "prefix_cache_mb": prefix_cache_mb,
        "temperature": temperature,
        "server_startup_s": round(startup, 1),
        "levels": levels,
        "saturated_at": saturated_at,
        "peak_tokens_per_s": peak["tokens_per_s"],
        "peak_concurrency": peak["concurrency"],
        "speedup_peak_vs_1": round(peak["tokens_per_s"] / levels[0]["tokens_per_s"], 2),
    }


def _server_stats(root_url: str) -> dict[str, Any]:
    """The server's counters (``/weight_version``: decoding steps, engine seconds, prefix cache)."""
    import httpx

    stats: dict[str, Any] = httpx.get(f"{root_url}/weight_version", timeout=30).json()
    return stats


def _engine_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The engine's decoding steps and seconds prefilling and decoding (wall, and CPU of its
    scheduler thread: its compute, whatever else runs on the machine) during one level."""
    keys = ("decode_steps", "prefill_s", "prefill_cpu_s", "decode_s", "decode_cpu_s")
    return {k: round(after.get(k, 0) - before.get(k, 0), 3) for k in keys if k in after}


def _prefix_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the prefix cache did during one level: lookups, hits, prompt tokens looked up and
    reused, and the share reused; plus what it held at the end."""
    counts = ("lookups", "hits", "looked_up_tokens", "reused_tokens", "stored", "evicted")
    out: dict[str, Any] = {k: after.get(k, 0) - before.get(k, 0) for k in counts}
    looked = out["looked_up_tokens"]
    out["reused_share"] = round(out["reused_tokens"] / looked, 3) if looked else 0.0
    out["entries"], out["bytes"] = after.get("entries", 0), after.get("bytes", 0)
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="calculator")
    parser.add_argument("--model", default="default", help="default, tiny or a model directory")
    parser.add_argument("--steps", type=int, default=2000, help="env steps for the overhead")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    parser.add_argument("--episodes", type=int, default=0, help="per level (0: 2 x concurrency)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy episodes")
    parser.add_argument("--saturation-gain", type=float, default=0.10)
    parser.add_argument("--skip-rollout", action="store_true")
    parser.add_argument(
        "--skip-overhead", action="store_true", help="no step-overhead figures (calculator-shaped)"
    )
    parser.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=None,
        help="the server's --prefix-cache-mb (0: no prefix caching; unset: its default)",
    )
    parser.add_argument("--engine", default="builtin", help="the server: builtin or vllm")
    parser.add_argument(
        "--server-cpus",
        default=None,
        help="the server's cores, e.g. 1 or 0,1 (default: all); the episodes run there too, as "
        "rollout workers do with inference.cpus",
    )
    parser.add_argument("--server-threads", type=int, default=None, help="built-in: torch threads")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)

    result: dict[str, Any] = {"benchmark": "env_step", "machine": machine_info()}
    if not args.skip_overhead:
        _print_overhead(result, args.env, args.steps)
    if not args.skip_rollout:
        levels = [int(x) for x in args.concurrency.split(",") if x]
        cpus = tuple(int(c) for c in args.server_cpus.split(",")) if args.server_cpus else None
        pin_process(cpus)  # this process plays the rollout workers
        where = f"cores {args.server_cpus}" if cpus else "all cores"
        print(f"rollout throughput vs concurrent episodes ({args.engine}, {where}, {args.model}):")
        result["rollout"] = rollout_sweep(
            args.model,
            args.env,
            levels,
            args.episodes,
            args.max_tokens,
            args.saturation_gain,
            prefix_cache_mb=args.prefix_cache_mb,
            temperature=args.temperature,
            engine=args.engine,
            server_cpus=cpus,
            server_threads=args.server_threads,
        )
        r = result["rollout"]
        print(
            f"  peak {r['peak_tokens_per_s']} tok/s at {r['peak_concurrency']} concurrent "
            f"episodes = {r['speedup_peak_vs_1']}x one at a time; "
            + (
                f"saturated at {r['saturated_at']} concurrent episodes"
                if r["saturated_at"]
                else "still growing at the last level run"
            )
        )
    write_json(args.json, result)
    return result


def _print_overhead(result: dict[str, Any], env: str, steps: int) -> None:
    overhead = step_overhead(env, steps)
    result["overhead"] = overhead
    print(f"env step overhead ({env}, {steps} episodes, gym.make wrappers included):")
    for key in ("step_final_answer", "step_with_tool_call", "reset"):
        row = overhead[key]
        print(
            f"  {key:20s} median {row['median_us']:8.1f} us  p90 {row['p90_us']:8.1f} us"
            f"  mean {row['mean_us']:8.1f} us  (n={row['n']})"
        )
    target = overhead["step_final_answer"]["median_us"] < 1000
    print(f"  target < 1 ms per step without a tool call: {'met' if target else 'NOT met'}")


if __name__ == "__main__":
    main()
