"""The cost of the network hop: an environment behind ``python -m areal_agents.envs.serve``.

Two figures, against a server started as its own process on 127.0.0.1:

1. **Step overhead**: the same steps (a calculator tool call, a final answer) and resets on the
   local environment and on :class:`~areal_agents.envs.remote.RemoteEnv` over HTTP and over
   WebSocket. Reported per kind of call (median, p90, mean) and as the time the hop adds to a
   median step. Target: remote adds under 2 ms per step on the calculator environment.
2. **Load**: 1, 16 and 256 clients at once (threads of this process, each a ``RemoteEnv`` as a
   rollout worker runs it), each repeating a whole session (connect, reset, a tool-call step, a
   final-answer step, close) for ``--seconds``: sessions completed per second and per-step
   latency (median, p90, p99).

    python benchmarks/env_server.py --json benchmarks/results/env_server.json
    python benchmarks/env_server.py --steps 50 --levels 1,2 --seconds 1      # smoke run

Client and server share this machine's cores, so the load figures include the client's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, latency, machine_info, write_json

from areal_agents.envs.registry import make_env
from areal_agents.envs.remote import RemoteEnv
from areal_agents.types import Turn

__all__ = ["load", "main", "start_server", "step_overhead"]

ANSWER = Turn(text="I computed it. The answer is \\boxed{42}.")


def _tool_call(expression: str) -> Turn:
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return Turn(text=f"<tool_call>\n{call}\n</tool_call>")


def start_server(env: str, max_sessions: int) -> tuple[subprocess.Popen[str], str]:
    """``python -m areal_agents.envs.serve`` on a free loopback port; returns it and its URL."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_agents.envs.serve", f"env={env}", "--port", "0",
         "--max-sessions", str(max_sessions)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("serving "):
            return proc, line.split(" at ")[1].split()[0]
    proc.wait()
    raise RuntimeError(f"the environment server exited with code {proc.returncode}")


def _time_steps(env: Any, steps: int) -> dict[str, list[float]]:
    resets: list[float] = []
    tools: list[float] = []
    finals: list[float] = []
    for i in range(steps):
        t0 = time.perf_counter()
        _, info = env.reset(seed=i)
        resets.append(time.perf_counter() - t0)
        expression = str(info["task_id"]).removeprefix("calc-")
        t0 = time.perf_counter()
        env.step(_tool_call(expression))
        tools.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        env.step(ANSWER)
        finals.append(time.perf_counter() - t0)
    return {"reset": resets, "step_with_tool_call": tools, "step_final_answer": finals}


def step_overhead(url: str, steps: int = 1000) -> dict[str, Any]:
    """Local vs HTTP vs WebSocket timings of the calculator environment."""
    envs = {
        "local": make_env("calculator"),
        "http": RemoteEnv(url, "calculator"),
        "websocket": RemoteEnv(url.replace("http", "ws", 1), "calculator"),
    }
    for env in envs.values():  # warm up connections, caches and the server's threads
        _time_steps(env, 20)
    samples = {name: _time_steps(env, steps) for name, env in envs.items()}
    for env in envs.values():
        env.close()
    out: dict[str, Any] = {}
    for name, kinds in samples.items():
        out[name] = {kind: latency(v, "us", 1, p99=True) for kind, v in kinds.items()}
        out[name]["step"] = latency(
            kinds["step_with_tool_call"] + kinds["step_final_answer"], "us", 1, p99=True
        )
    local_ms = out["local"]["step"]["median_us"] / 1000
    for name in ("http", "websocket"):
        out[name]["added_ms_per_step"] = round(out[name]["step"]["median_us"] / 1000 - local_ms, 3)
        out[name]["added_ms_per_step_mean"] = round(
            (out[name]["step"]["mean_us"] - out["local"]["step"]["mean_us"]) / 1000, 3
        )
    return out


def load(url: str, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads repeating whole sessions for ``seconds``; rates and step latency."""
    steps: list[list[float]] = [[] for _ in range(clients)]
    sessions = [0] * clients
    errors: list[str] = []
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(k: int) -> None:
        start.wait()
        i = 0
        while time.perf_counter() < stop_at[0]:
            try:
                env = RemoteEnv(url, "calculator")
                _, info = env.reset(seed=k * 100_000 + i)
                expression = str(info["task_id"]).removeprefix("calc-")
                for action in (_tool_call(expression), ANSWER):
                    t0 = time.perf_counter()
                    env.step(action)
                    steps[k].append(time.perf_counter() - t0)
                env.close()
            except Exception as e:  # counted and shown, never hidden
                errors.append(f"{type(e).__name__}: {e}"[:200])
                continue
            sessions[k] += 1
            i += 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    begin = time.perf_counter()
    stop_at[0] = begin + seconds
    start.wait()
    for t in threads:
        t.join(seconds + 120)
    elapsed = time.perf_counter() - begin
    done = sum(sessions)
    return {
        "clients": clients,
        "seconds": round(elapsed, 3),
        "sessions": done,
        "sessions_per_s": round(done / elapsed, 2),
        "steps_per_s": round(2 * done / elapsed, 2),
        "step": latency([s for per in steps for s in per], "us", 1, p99=True),
        "errors": len(errors),
        "first_errors": errors[:3],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="episodes timed per transport")
    parser.add_argument("--levels", default="1,16,256", help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each level")
    parser.add_argument("--transports", default="http,websocket")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    result: dict[str, Any] = {"machine": machine_info(), "env": "calculator"}
    proc, url = start_server("calculator", max_sessions=max(levels) + 16)
    try:
        result["server"] = url
        overhead = step_overhead(url, args.steps)
        result["overhead"] = overhead
        print(f"step overhead, calculator ({args.steps} episodes each; target: adds < 2 ms):")
        print(f"{'':10s} {'reset':>10s} {'tool step':>10s} {'answer':>10s} {'added/step':>11s}")
        for name, row in overhead.items():
            added = row.get("added_ms_per_step")
            print(
                f"{name:10s} {row['reset']['median_us'] / 1000:>8.3f}ms "
                f"{row['step_with_tool_call']['median_us'] / 1000:>8.3f}ms "
                f"{row['step_final_answer']['median_us'] / 1000:>8.3f}ms "
                + (f"{added:>9.3f}ms" if added is not None else f"{'-':>11s}")
            )
        result["load"] = []
        print(f"\nload ({args.seconds:g} s per level; whole sessions: reset + 2 steps + close):")
        print(f"{'transport':10s} {'clients':>7s} {'sessions/s':>10s} {'steps/s':>8s} "
              f"{'p50 step':>9s} {'p90':>8s} {'p99':>8s} {'errors':>6s}")  # fmt: skip
        for transport in args.transports.split(","):
            target = url if transport == "http" else url.replace("http", "ws", 1)
            for clients in levels:
                row = {"transport": transport, **load(target, clients, args.seconds)}
                result["load"].append(row)
                ms = {k: row["step"].get(f"{k}_us", 0) / 1000 for k in ("median", "p90", "p99")}
                print(
                    f"{transport:10s} {clients:>7d} {row['sessions_per_s']:>10.1f} "
                    f"{row['steps_per_s']:>8.1f} {ms['median']:>7.2f}ms "
                    f"{ms['p90']:>6.2f}ms {ms['p99']:>6.2f}ms {row['errors']:>6d}"
                )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
