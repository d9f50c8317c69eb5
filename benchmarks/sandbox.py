"""Sandbox latency and throughput, against the raw ``docker exec`` floor measured in the same run.

    python benchmarks/sandbox.py [--iters 40] [--episodes 4] [--execs 10]

Prints, for a tiny Python program: p50/p95 of ``DockerSandbox.run_python`` and of the raw floor
(the SDK's ``exec_run`` and the ``docker exec`` CLI, into the same container, interleaved with
ours so that load from other jobs hits both alike), the warm-pool acquire p50/p95, execs/s with
N concurrent episodes (asyncio + ``arun_python``), and the bubblewrap/process backends for
comparison. Targets (from the issue): p50 within 1.2x of the floor, acquire p50 < 20 ms,
>= 15 execs/s on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from collections.abc import Callable

from areal_agents.sandboxes import make_sandbox
from areal_agents.sandboxes.docker import DockerSandbox
from areal_agents.sandboxes.docker_pool import (
    SANDBOX_USER,
    docker_client,
    owner_labels,
    shutdown_all,
)
from areal_agents.sandboxes.image import default_image

PROGRAM = "print(1)"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def fmt(name: str, xs: list[float]) -> str:
    return f"{name:34s} p50 {pct(xs, 0.5) * 1e3:7.1f} ms   p95 {pct(xs, 0.95) * 1e3:7.1f} ms"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def exec_latency(iters: int) -> None:
    client = docker_client()
    with make_sandbox("docker", pool_size=2) as sb:
        assert isinstance(sb, DockerSandbox)
        cid = sb.container_id
        container = client.containers.get(cid)
        argv = ["python3", "-c", PROGRAM]
        cli = ["docker", "exec", "-u", SANDBOX_USER, cid, *argv]

        def ours() -> None:
            res = sb.run_python(PROGRAM)
            assert res.stdout == "1\n", res

        def sdk() -> None:
            res = container.exec_run(argv, user=SANDBOX_USER)
            assert res.output == b"1\n", res

        def docker_cli() -> None:
            subprocess.run(cli, check=True, capture_output=True)

        for fn in (ours, sdk, docker_cli):  # warm up
            fn()
        t_ours, t_sdk, t_cli = [], [], []
        for _ in range(iters):
            t_ours.append(timed(ours))
            t_sdk.append(timed(sdk))
            t_cli.append(timed(docker_cli))
        shell_ours = [timed(lambda: sb.run("true")) for _ in range(iters)]
        shell_sdk = [
            timed(lambda: container.exec_run(["true"], user=SANDBOX_USER)) for _ in range(iters)
        ]
    print(f"exec latency, python3 -c {PROGRAM!r}, {iters} runs each (interleaved):")
    print(fmt("  DockerSandbox.run_python", t_ours))
    print(fmt("  raw floor: SDK exec_run", t_sdk))
    print(fmt("  raw floor: docker exec CLI", t_cli))
    print(fmt("  DockerSandbox.run('true')", shell_ours))
    print(fmt("  raw floor: SDK exec_run true", shell_sdk))
    r_sdk = pct(t_ours, 0.5) / pct(t_sdk, 0.5)
    r_cli = pct(t_ours, 0.5) / pct(t_cli, 0.5)
    print(f"  p50 ratio vs SDK floor {r_sdk:.2f}x, vs CLI floor {r_cli:.2f}x (target <= 1.2x)")


def acquire_latency(iters: int, pause: float) -> None:
    times = []
    make_sandbox("docker", pool_size=2).close()  # the pool exists and is warm
    time.sleep(1.5)
    for _ in range(iters):
        start = time.perf_counter()
        sb = make_sandbox("docker", pool_size=2)
        times.append(time.perf_counter() - start)
        sb.run("true")
        sb.close()
        time.sleep(pause)  # an episode's worth of time for the background reset / refill
    print(f"warm-pool acquire, {iters} episodes:")
    print(fmt("  make_sandbox('docker')", times) + "   (target p50 < 20 ms)")


async def throughput(episodes: int, execs: int) -> None:
    boxes = [make_sandbox("docker", pool_size=episodes) for _ in range(episodes)]
    await asyncio.gather(*(sb.arun("true") for sb in boxes))  # warm

    async def episode(sb: DockerSandbox) -> None:
        for i in range(execs):
            res = await sb.arun_python(f"print({i} * {i})")
            assert res.stdout == f"{i * i}\n", res

    start = time.perf_counter()
    await asyncio.gather(*(episode(sb) for sb in boxes))  # type: ignore[arg-type]
    took = time.perf_counter() - start
    for sb in boxes:
        await sb.aclose()
    n = episodes * execs
    print(
        f"throughput: {episodes} concurrent episodes x {execs} run_python = {n} execs in "
        f"{took:.2f} s -> {n / took:.1f} execs/s   (target >= 15)"
    )
    # The same load through the raw SDK, one thread per container: the engine's own ceiling.
    client = docker_client()
    containers = [
        client.containers.run(
            default_image(),
            ["sleep", "infinity"],
            detach=True,
            network_mode="none",
            labels=owner_labels(),
            init=True,
        )
        for _ in range(episodes)
    ]
    try:

        def raw_episode(c: object) -> None:
            for i in range(execs):
                c.exec_run(["python3", "-c", f"print({i} * {i})"], user=SANDBOX_USER)  # type: ignore[attr-defined]

        start = time.perf_counter()
        await asyncio.gather(*(asyncio.to_thread(raw_episode, c) for c in containers))
        took = time.perf_counter() - start
    finally:
        for c in containers:
            c.remove(force=True)
    print(f"  raw floor, same load via SDK exec_run: {n / took:.1f} execs/s")


def local_backends(iters: int) -> None:
    for backend in ("bubblewrap", "process"):
        try:
            with make_sandbox(backend) as sb:
                sb.run_python(PROGRAM)
                xs = [timed(lambda sb=sb: sb.run_python(PROGRAM)) for _ in range(iters)]
        except Exception as e:
            print(f"  {backend}: unavailable ({e})")
            continue
        print(fmt(f"  {backend}.run_python", xs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--execs", type=int, default=10)
    ap.add_argument("--pause", type=float, default=0.3, help="seconds between acquires")
    args = ap.parse_args()
    try:
        exec_latency(args.iters)
        acquire_latency(args.iters, args.pause)
        asyncio.run(throughput(args.episodes, args.execs))
        print("daemon-less backends, same program:")
        local_backends(args.iters)
    finally:
        shutdown_all()


if __name__ == "__main__":
    main()
