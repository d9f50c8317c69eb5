"""``python -m areal_agents.eval``: score any OpenAI-compatible endpoint on any environment.

    python -m areal_agents.eval env=calculator policy.base_url=http://127.0.0.1:8000/v1 \\
        policy.model=SmolLM2-135M-Instruct num_episodes=64 samples_per_task=4 concurrency=8

``env`` is a short name or any Gymnasium id (``acme/MyTask-v0``; ``module:MyTask-v0`` imports
``module`` first). Without ``policy.base_url`` the built-in server is started on
``policy.model`` (the offline default model unless told otherwise). Task ``i`` is the one
``env.reset(seed=seed + i)`` draws; each task is played ``samples_per_task`` times. Writes, in
``output_dir``: ``transcripts.jsonl`` (one line per finished episode, appended as they finish),
``summary.json`` (mean reward, unbiased pass@k, tool-call error rates, turns and tokens per
episode, dropped episodes), ``config.yaml`` and ``index.html`` (a static transcript viewer).
``--resume`` (or ``resume=true``) keeps the finished episodes and plays only the rest.
Episodes that hit an infrastructure fault are dropped and counted, never scored 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import math
import signal
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from areal_agents.config import dump_yaml, load_config, to_dict
from areal_agents.errors import AgentsError, ConfigError, InfrastructureError
from areal_agents.files import read_jsonl
from areal_agents.policies.base import Policy

if TYPE_CHECKING:
    from areal_agents.serving.server import BuiltinServer

__all__ = ["EvalConfig", "EvalPolicyConfig", "main", "pass_at_k", "run_eval", "summarize"]

logger = logging.getLogger(__name__)


@dataclass
class EvalPolicyConfig:
    """The endpoint under evaluation (chat completions)."""

    base_url: str = ""
    """``http://host:port/v1``; empty starts the built-in server on ``model``."""
    model: str = "SmolLM2-135M-Instruct"
    """The served model name (or, for the built-in server, a model directory)."""
    api_key: str = ""
    """Empty reads ``AREAL_API_KEY`` / ``OPENAI_API_KEY`` from the environment."""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    tool_choice: str = "auto"
    timeout_s: float = 120.0
    """Seconds per request."""
    max_retries: int = 4
    """Retries per request on timeouts, 429 and 5xx (with backoff)."""

    def __post_init__(self) -> None:
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"policy.base_url={self.base_url!r}: expected http(s)://host:port/v1")
        if self.max_tokens < 1:
            raise ConfigError(f"policy.max_tokens={self.max_tokens}: must be at least 1")


@dataclass
class EvalConfig:
    """Evaluation of one policy on one environment."""

    env: str = "calculator"
    """A short name (``calculator``) or a Gymnasium id."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gym.make`` (``env_kwargs={max_turns: 4}``)."""
    policy: EvalPolicyConfig = field(default_factory=EvalPolicyConfig)
    num_episodes: int = 16
    """Episodes in all: ``num_episodes / samples_per_task`` tasks."""
    samples_per_task: int = 1
    """Episodes per task (pass@k needs k <= samples_per_task)."""
    seed: int = 0
    """Task ``i`` is drawn by ``env.reset(seed=seed + i)``."""
    concurrency: int = 8
    """Episodes played at once."""
    pass_threshold: float = 1.0
    """An episode passes when its reward is at least this."""
    output_dir: str = "outputs/eval"
    resume: bool = False
    """Keep finished episodes from ``output_dir`` and play only the missing ones."""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.samples_per_task < 1:
            raise ConfigError(f"samples_per_task={self.samples_per_task}: must be at least 1")
        if self.num_episodes < 1 or self.num_episodes % self.samples_per_task:
            raise ConfigError(
                f"num_episodes={self.num_episodes} must be a positive multiple of "
                f"samples_per_task={self.samples_per_task}"
            )
        if self.concurrency < 1:
            raise ConfigError(f"concurrency={self.concurrency}: must be at least 1")

    @property
    def num_tasks(self) -> int:
        return self.num_episodes // self.samples_per_task


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator: 1 - C(n-c, k) / C(n, k) (n samples, c correct).

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 2)
    (0.25, 1.0, 0.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _ks(samples: int) -> list[int]:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= samples]
    return sorted({*ks, samples})


def summarize(
    records: Sequence[Mapping[str, Any]], cfg: EvalConfig, dropped: int
) -> dict[str, Any]:
    """The summary of finished episode records (as written to ``transcripts.jsonl``)."""
    n = len(records)
    by_task: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by_task[int(r["task_index"])].append(r)
    passes: dict[str, float] = {}
    for k in _ks(cfg.samples_per_task):
        values = [
            pass_at_k(len(rs), sum(r["reward"] >= cfg.pass_threshold for r in rs), k)
            for rs in by_task.values()
            if len(rs) >= k
        ]
        if values:
            passes[f"pass@{k}"] = sum(values) / len(values)
    errors: Counter[str] = Counter()
    for r in records:
        errors.update({kind: int(v) for kind, v in (r.get("tool_errors") or {}).items()})
    calls = sum(int(r.get("tool_calls", 0)) for r in records)
    attempts = calls + errors.get("parse", 0)  # parse failures never became calls

    def mean(key: str) -> float:
        return sum(float(r.get(key, 0) or 0) for r in records) / n if n else 0.0

    return {
        "env": cfg.env,
        "model": cfg.policy.model,
        "base_url": cfg.policy.base_url or "builtin",
        "episodes": n,
        "episodes_planned": cfg.num_episodes,
        "episodes_dropped": dropped,
        "tasks": len(by_task),
        "samples_per_task": cfg.samples_per_task,
        "mean_reward": mean("reward"),
        **passes,
        "pass_threshold": cfg.pass_threshold,
        "turns_per_episode": mean("num_turns"),
        "completion_tokens_per_episode": mean("completion_tokens"),
        "tool_calls_per_episode": mean("tool_calls"),
        "tool_call_attempts": attempts,
        "tool_error_rate": sum(errors.values()) / attempts if attempts else 0.0,
        "tool_error_rates": {
            k: v / attempts if attempts else 0.0 for k, v in sorted(errors.items())
        },
        "tool_errors": dict(sorted(errors.items())),
        "truncated_rate": sum(bool(r.get("truncated")) for r in records) / n if n else 0.0,
        "mean_duration_s": mean("duration_s"),
    }


def _read_finished(path: Path) -> dict[str, dict[str, Any]]:
    # a line cut by a crash is skipped: that episode is replayed
    return {str(r["key"]): r for r in read_jsonl(path, torn_ok=True) if "key" in r}


def _check_resumable(cfg: EvalConfig, out: Path) -> None:
    import yaml

    saved_path = out / "config.yaml"
    if not saved_path.is_file():
        return
    saved = yaml.safe_load(saved_path.read_text()) or {}
    now = to_dict(cfg)
    for key in ("env", "seed", "samples_per_task"):
        if saved.get(key) != now.get(key):
            raise ConfigError(
                f"--resume: {key}={now.get(key)!r} differs from the run in {out} "
                f"({saved.get(key)!r}); use another output_dir or the same {key}"
            )
    if (saved.get("policy") or {}).get("model") != cfg.policy.model:
        raise ConfigError(f"--resume: policy.model differs from the run in {out}")


def _make_policy(cfg: EvalPolicyConfig, base_url: str, model: str) -> Policy:
    from areal_agents.policies.chat_client import ChatPolicy

    return ChatPolicy(
        base_url,
        model,
        api_key=cfg.api_key or None,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_tokens=cfg.max_tokens,
        tool_choice=cfg.tool_choice or None,
        timeout=cfg.timeout_s,
        max_retries=cfg.max_retries,
    )


async def run_eval(cfg: EvalConfig, policy: Policy) -> dict[str, Any]:
    """Play the missing episodes of ``cfg`` with ``policy``; write outputs; return the summary."""
    import gymnasium as gym
    from tqdm import tqdm

    from areal_agents.envs.registry import resolve_env_id
    from areal_agents.rollout import run_episode

    env_id = resolve_env_id(cfg.env)
    if ":" in env_id:  # Gymnasium's "module:Env-v0": import the module (it registers the env)
        module, _, env_id = env_id.partition(":")
        importlib.import_module(module)
    gym.spec(env_id)  # fails now, with gymnasium's message, for an unknown id
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    transcripts = out / "transcripts.jsonl"
    if cfg.resume:
        _check_resumable(cfg, out)
        finished = _read_finished(transcripts)
        # Rewrite without lines a crash cut short, so that new lines append cleanly.
        tmp = transcripts.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in finished.values()))
        tmp.replace(transcripts)
    else:
        finished = {}
        transcripts.unlink(missing_ok=True)
    dump_yaml(cfg, out / "config.yaml")
    plan = [
        (f"{i:05d}-{j:03d}", i, j)
        for i in range(cfg.num_tasks)
        for j in range(cfg.samples_per_task)
        if f"{i:05d}-{j:03d}" not in finished
    ]
    records = [r for r in finished.values() if int(r["task_index"]) < cfg.num_tasks]
    dropped: list[dict[str, Any]] = []
    semaphore = asyncio.Semaphore(cfg.concurrency)
    lock = asyncio.Lock()
    bar = tqdm(total=len(plan), desc=f"eval {env_id}", disable=not cfg.progress, unit="ep")

    async def play(key: str, task_index: int, sample: int) -> None:
        async with semaphore:
            env = await asyncio.to_thread(gym.make, env_id, **cfg.env_kwargs)
            try:
                episode = await run_episode(env, policy, seed=cfg.seed + task_index)
            except InfrastructureError as e:
                logger.warning("episode %s dropped: %s", key, e)
                dropped.append({"key": key, "error": f"{type(e).__name__}: {e}"})
                return
            finally:
                await asyncio.to_thread(env.close)
        record = {
            "key": key,
            "task_index": task_index,
            "sample": sample,
            "seed": cfg.seed + task_index,
            **episode.to_json(),
            "completion_tokens": sum(
                len(t.completion_ids)
                if t.completion_ids is not None
                else (t.usage or {}).get("completion_tokens", 0)
                for t in episode.turns
            ),
        }
        async with lock:
            with transcripts.open("a") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            records.append(record)
            bar.update(1)
            bar.set_postfix(reward=f"{sum(r['reward'] for r in records) / len(records):.3f}")

    try:
        await asyncio.gather(*(play(*p) for p in plan))
    finally:
        bar.close()
    records.sort(key=lambda r: str(r["key"]))
    summary = summarize(records, cfg, len(dropped))
    summary["dropped"] = dropped
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from areal_agents.eval_viewer import write_viewer

    write_viewer(out / "index.html", records, summary)
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command line: ``key=value`` overrides of :class:`EvalConfig` (and ``--resume``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return {}
    args = ["resume=true" if a == "--resume" else a for a in args]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(EvalConfig, args)
        return _run(cfg)
    except AgentsError as e:
        if argv is not None:
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


@contextlib.contextmanager
def _sigterm_exits(on_signal: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGTERM calls ``on_signal`` and raises ``SystemExit(143)`` (once).

    Python's default SIGTERM ends the process without running ``finally`` blocks (that is how
    a killed eval once left its server running). Outside the main thread this does nothing:
    only the main thread can handle signals. The previous handler is restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        on_signal()
        if not raised:  # a second SIGTERM must not interrupt the clean-up the first started
            raised = True
            raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(cfg: EvalConfig) -> dict[str, Any]:
    servers: list[BuiltinServer] = []

    def stop_now() -> None:  # in the signal handler: no waiting, in-flight requests just fail
        for server in servers:
            server.terminate()

    base_url, model = cfg.policy.base_url, cfg.policy.model
    # The server is stopped on every way out: normal end, error, Ctrl-C, SIGTERM; a SIGKILL
    # of this process stops it too (the server watches its parent).
    with _sigterm_exits(stop_now):
        try:
            if not base_url:
                from areal_agents.serving.server import BuiltinServer

                servers.append(
                    BuiltinServer(model="default" if model == "SmolLM2-135M-Instruct" else model)
                )
                servers[0].start().wait_ready(timeout=300)
                base_url, model = servers[0].base_url, servers[0].served_model_name
            policy = _make_policy(cfg.policy, base_url, model)
            summary = asyncio.run(run_eval(cfg, policy))
        finally:
            for server in servers:
                server.stop()
    shown = {k: v for k, v in summary.items() if k not in ("dropped", "tool_error_rates")}
    print(json.dumps(shown, indent=2))
    print(f"transcripts, summary and viewer in {cfg.output_dir}")
    return summary


if __name__ == "__main__":
    main()
