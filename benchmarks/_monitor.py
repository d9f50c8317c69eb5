"""The async vs sync benchmark's outside view of a training run: which of its processes
generate and which learn, and how busy each was (CPU time sampled every ``every_s``)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Monitor", "generates"]


def generates(cmd: str) -> bool:
    """Whether a process of the run (by its command line) is generation: the built-in server,
    or vLLM's API server and the engine and worker processes it starts (``VLLM::EngineCore``,
    ``VLLM::Worker``: they decode, the API server does not)."""
    return (
        "areal_agents.serving.serve" in cmd or "vllm.entrypoints" in cmd or cmd.startswith("VLLM::")
    )


class Monitor(threading.Thread):
    """Samples the CPU use of the server and learner processes of one training run."""

    def __init__(self, pid: int, metrics: Path, every_s: float, threshold: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.metrics, self.every_s, self.threshold = pid, metrics, every_s, threshold
        self.samples: list[dict[str, Any]] = []
        self.loop_start: float | None = None
        self.threads: dict[str, str] = {}
        self._halt = threading.Event()

    def _roles(self) -> dict[int, str]:
        import psutil

        roles: dict[int, str] = {}
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return roles
        for proc in children:
            try:
                cmd = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if generates(cmd):
                roles[proc.pid] = "generation"
            elif cmd.startswith("ray::Learner"):
                roles[proc.pid] = "learning"
            elif cmd.startswith("ray::RolloutWorker"):
                roles[proc.pid] = "rollout"
        return roles

    def _cpu(self, pid: int) -> float | None:
        import psutil

        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return None
        return float(t.user + t.system)

    def _omp(self, pid: int, role: str) -> None:
        if role in self.threads:
            return
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return
        omp = [e.decode().split("=", 1)[1] for e in env if e.startswith(b"OMP_NUM_THREADS=")]
        self.threads[role] = omp[0] if omp else "unset"

    def run(self) -> None:
        last: dict[int, float] = {}
        last_t = time.monotonic()
        lines = 0
        while not self._halt.wait(self.every_s):
            now = time.monotonic()
            roles = self._roles()
            use: dict[str, float] = {}
            for pid, role in roles.items():
                self._omp(pid, role)
                cpu = self._cpu(pid)
                if cpu is None:
                    continue
                if pid in last:
                    share = (cpu - last[pid]) / max(now - last_t, 1e-6)
                    use[role] = max(use.get(role, 0.0), share)
                last[pid] = cpu
            last_t = now
            self.samples.append({"t": now, **{k: round(v, 3) for k, v in use.items()}})
            try:
                rows = self.metrics.read_text().splitlines() if self.metrics.exists() else []
            except OSError:
                rows = []
            if len(rows) > lines:
                lines = len(rows)
                try:
                    elapsed = float(json.loads(rows[-1])["time/elapsed_s"])
                    self.loop_start = now - elapsed
                except (ValueError, KeyError):
                    pass

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def idle_fractions(self, start: float, end: float) -> dict[str, float | None]:
        window = [s for s in self.samples if start <= s["t"] <= end]
        out: dict[str, float | None] = {}
        for role in ("generation", "learning"):
            seen = [float(s[role]) for s in window if role in s]
            out[role] = (
                round(sum(1 for v in seen if v < self.threshold) / len(seen), 3) if seen else None
            )
        return out
