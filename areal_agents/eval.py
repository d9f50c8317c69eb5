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
Without ``output_dir`` each run gets a new folder, ``outputs/eval/<date>/<time>_<env>_<model>``
(:func:`new_output_dir`; two runs started in the same second get two folders), so the same
command can run again. ``--resume`` (or ``resume=true``) with the ``output_dir`` of an earlier
run keeps its finished episodes and plays only the rest; an ``output_dir`` given that already
holds an evaluation is refused unless ``--resume`` or ``overwrite=true`` is given. ``--check``
validates the command and prints the resolved configuration without starting anything.
``policy.temperature`` unset means greedy (0.0) for ``samples_per_task=1`` and 1.0 for pass@k
with ``samples_per_task > 1``; the sampling settings used are in ``summary.json``
(``sampling``).

Episodes that hit an infrastructure fault (an endpoint that times out, fails or answers
malformed replies, after the client's bounded retries) are dropped and counted, never scored
0; an episode whose environment raised an unexpected exception is counted as failed, with
the traceback in ``summary.json``. Malformed tool calls of the model are counted
(``malformed_tool_calls``) and reach the environment as errors, not answers. Every bad
setting is refused before anything starts, with the key named. Exit status: 0 when episodes
finished, 1 when none did (every episode dropped or failed) or any episode failed, 2 for a
configuration error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import yaml

from areal_agents.config import describe, dump_yaml, to_dict, writable_dir
from areal_agents.errors import AgentsError, ConfigError, InfrastructureError, brief
from areal_agents.eval_config import EvalConfig, EvalPolicyConfig
from areal_agents.eval_summary import exit_status, failure_line, pass_at_k, summarize
from areal_agents.files import read_jsonl
from areal_agents.policies.base import Policy

if TYPE_CHECKING:
    from areal_agents.serving.server import BuiltinServer

__all__ = [
    "EvalConfig",
    "EvalPolicyConfig",
    "exit_status",
    "main",
    "new_output_dir",
    "pass_at_k",
    "preflight",
    "run_eval",
    "summarize",
]

logger = logging.getLogger(__name__)


def _json_line(record: Mapping[str, Any]) -> str:
    """One JSONL line; text that is not valid Unicode (lone surrogates) is written escaped."""
    try:
        line = json.dumps(record, ensure_ascii=False)
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, ensure_ascii=True)
    return line + "\n"


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


#: Where the runs without ``output_dir`` go, under the current directory.
OUTPUTS = Path("outputs") / "eval"


def new_output_dir(cfg: EvalConfig, *, create: bool = True, now: float | None = None) -> Path:
    """The folder of a run without ``output_dir``: ``outputs/eval/<date>/<time>_<env>_<model>``.

    ``create=True`` makes it here, with an exclusive ``mkdir``: a run started in the same second
    (another process, the same command) finds it taken and gets ``..._2``, then ``..._3``, never
    a folder another run writes to. ``create=False`` names the first one free now (``--check``).

    >>> cfg = EvalConfig(env="remote:ws://127.0.0.1:8100/calculator")
    >>> str(new_output_dir(cfg, create=False, now=0)).startswith("outputs/eval/19")
    True
    >>> new_output_dir(cfg, create=False, now=0).name[9:]
    'remote-ws-127.0.0.1-8100-calculator_SmolLM2-135M-Instruct'
    """
    stamp = time.localtime(now)
    model = Path(cfg.policy.model).name or cfg.policy.model
    name = f"{time.strftime('%H-%M-%S', stamp)}_{_slug(cfg.env)}_{_slug(model)}"
    base = OUTPUTS / time.strftime("%Y-%m-%d", stamp) / name
    return _unique_dir(base, create=create)


def _unique_dir(base: Path, *, create: bool = True) -> Path:
    """``base``, or ``base_2``, ``base_3``...: the first an exclusive ``mkdir`` makes (or, with
    ``create=False``, the first that does not exist)."""
    try:
        if create:
            base.parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            path = base.with_name(base.name if n == 1 else f"{base.name}_{n}")
            if not create:
                if not path.exists():
                    return path
                continue
            with contextlib.suppress(FileExistsError):
                path.mkdir()
                return path
    except OSError as e:
        raise ConfigError(f"output_dir: cannot create {base} ({e.strerror})") from None
    raise AssertionError("unreachable")


def _slug(text: str) -> str:
    """``text`` as part of a folder name: letters, digits and ``.+-``, at most 48 of them."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-.")[:48] or "x"


def _make_policy(cfg: EvalPolicyConfig, base_url: str, model: str, temperature: float) -> Policy:
    from areal_agents.policies.chat_client import ChatPolicy

    return ChatPolicy(
        base_url,
        model,
        api_key=cfg.api_key or None,
        temperature=temperature,
        top_p=cfg.top_p,
        max_tokens=cfg.max_tokens,
        tool_choice=cfg.tool_choice or None,
        timeout=cfg.timeout_s,
        max_retries=cfg.max_retries,
        backoff_s=cfg.backoff_s,
        max_response_bytes=int(cfg.max_response_mb * 2**20),
        keep_reasoning=cfg.keep_reasoning,
    )


def preflight(cfg: EvalConfig, *, create_dirs: bool = True) -> str:
    """Refuse what would fail once the run is under way; the Gymnasium id of ``cfg.env``.

    Builds the environment once with ``env_kwargs`` and checks that ``output_dir`` can be
    written (created unless ``create_dirs=False``) and holds no earlier evaluation unless
    ``resume`` or ``overwrite`` says what to do with it, raising :class:`ConfigError` with the
    key named (before any server starts).
    """
    from areal_agents.preflight import check_env

    env_id = check_env(cfg.env, cfg.env_kwargs, name_key="env", kwargs_key="env_kwargs")
    out = writable_dir(cfg.output_dir, "output_dir", create=create_dirs)
    earlier = [name for name in ("summary.json", "transcripts.jsonl") if (out / name).exists()]
    if earlier and not (cfg.resume or cfg.overwrite):
        raise ConfigError(
            f"output_dir={cfg.output_dir} already holds an evaluation ({', '.join(earlier)}): "
            "add --resume to finish it, overwrite=true to replace it, or choose another "
            "output_dir"
        )
    return env_id


async def run_eval(cfg: EvalConfig, policy: Policy, *, env_id: str | None = None) -> dict[str, Any]:
    """Play the missing episodes of ``cfg`` with ``policy``; write outputs; return the summary.

    ``env_id`` is what :func:`preflight` returned for ``cfg`` (None runs it here).
    """
    import gymnasium as gym
    from tqdm import tqdm

    from areal_agents.rollout import run_episode

    env_id = env_id or preflight(cfg)
    out = Path(cfg.output_dir)
    transcripts = out / "transcripts.jsonl"
    if cfg.resume:
        _check_resumable(cfg, out)
        finished = _read_finished(transcripts)
        # Rewrite without lines a crash cut short, so that new lines append cleanly.
        tmp = transcripts.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(_json_line(r) for r in finished.values()))
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
    failed: list[dict[str, Any]] = []
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
                kind = type(e).__name__
                dropped.append({"key": key, "kind": kind, "error": f"{kind}: {e}"[:2000]})
                return
            except AgentsError:  # a configuration error (a refused API key...): ends the run
                raise
            except Exception as e:  # a bug in the environment: count it, keep the run going
                logger.warning("episode %s failed: %s: %s", key, type(e).__name__, str(e)[:300])
                failed.append(
                    {
                        "key": key,
                        "kind": type(e).__name__,
                        "error": str(e)[:2000],
                        "traceback": traceback.format_exc(limit=20)[-8000:],
                    }
                )
                return
            finally:
                await asyncio.to_thread(env.close)
        record = {
            "key": key,
            "task_index": task_index,
            "sample": sample,
            "seed": cfg.seed + task_index,
            **episode.to_json(),
            "malformed_tool_calls": sum(
                not c.name for t in episode.turns for c in (t.tool_calls or ())
            ),
            "completion_tokens": sum(
                len(t.completion_ids)
                if t.completion_ids is not None
                else (t.usage or {}).get("completion_tokens", 0)
                for t in episode.turns
            ),
        }
        async with lock:
            with transcripts.open("a", encoding="utf-8") as f:
                f.write(_json_line(record))
            records.append(record)
            bar.update(1)
            bar.set_postfix(reward=f"{sum(r['reward'] for r in records) / len(records):.3f}")

    try:
        await asyncio.gather(*(play(*p) for p in plan))
    finally:
        bar.close()
        close = getattr(policy, "aclose", None)
        if close is not None:  # its connections belong to this loop, which ends with the run
            await close()
    records.sort(key=lambda r: str(r["key"]))
    summary = summarize(records, cfg, len(dropped))
    summary["episodes_failed"] = len(failed)
    summary["dropped_by_kind"] = dict(Counter(d["kind"] for d in dropped))
    summary["endpoint"] = dict(getattr(policy, "stats", None) or {})
    summary["dropped"] = dropped
    summary["failed"] = failed
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from areal_agents.eval_viewer import write_viewer

    write_viewer(out / "index.html", records, summary)
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command line: ``key=value`` overrides of :class:`EvalConfig` (and ``--resume``),
    composed by Hydra (:mod:`areal_agents.cli`: ``-m`` sweeps, ``--cfg job``, ``--config-dir``).

    Returns the summary (after a sweep, the last job's). Raises ``SystemExit(1)`` after writing
    it when no episode finished or some episode failed (see :func:`exit_status`); a
    configuration error exits with 2 and another :class:`AgentsError` with 1 (from the command
    line), or is raised (when ``argv`` is given). ``--check`` validates and prints the
    configuration, starts nothing, returns {}.
    """
    from areal_agents import cli

    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        command = cli.parse(EvalConfig, args, flags={"--resume": "resume=true"})
        if command.help:
            print(__doc__)
            print("  config=FILE.yaml  # a YAML mapping of keys, loaded before the overrides")
            print("  --resume  # same as resume=true")
            print("\n".join(_HELP_FLAGS))
            print("\n".join(describe(EvalConfig())))
            return {}
        if command.hydra_only and not command.check:  # with --check: validate and print instead
            cli.launch(command, _job, name="eval", sweep_dir=_SWEEP_DIR)
            return {}
        configs = cli.job_configs(command)
        cli.check_sweep_dirs(command, configs)
        fresh = not command.multirun and not configs[0].output_dir  # a new folder of its own
        if fresh:
            configs = [
                replace(configs[0], output_dir=str(new_output_dir(configs[0], create=False)))
            ]
        for cfg in configs:  # a single run's directory is made now: Hydra writes .hydra/ there
            preflight(cfg, create_dirs=not (command.check or command.multirun or fresh))
        if command.check:
            for num, cfg in enumerate(configs):
                where = cfg.output_dir + (" (a new folder)" if fresh else "")
                if command.multirun:
                    print(f"# job {num}: {' '.join(cli.job_overrides(command)[num])}")
                    if cli.default_output(command, cfg):
                        where = f"hydra.sweep.dir/{num}"
                print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
                print(f"configuration OK (nothing started); results would go to {where}")
            return {}
        job: Callable[[EvalConfig], dict[str, Any]] = _job
        run_dir = None if command.multirun else configs[0].output_dir
        if fresh:  # made now, by this run only; Hydra composes the job with output_dir unset
            run_dir = new = str(new_output_dir(configs[0]))
            job = lambda cfg: _job(cfg if cfg.output_dir else replace(cfg, output_dir=new))  # noqa: E731
        sweep_dir = _SWEEP_DIR
        if command.multirun and not any(o.startswith("hydra.sweep.dir=") for o in args):
            sweep_dir = str(_new_sweep_dir())
        results = cli.launch(command, job, name="eval", sweep_dir=sweep_dir, run_dir=run_dir)
    except AgentsError as e:
        if argv is not None:
            raise
        print(f"error: {brief(e)}", file=sys.stderr)
        raise SystemExit(2 if isinstance(e, ConfigError) else 1) from None
    return results[-1] if results else {}


#: ``hydra.sweep.dir`` of a ``-m`` sweep: each job writes to ``<sweep dir>/<job number>``.
_SWEEP_DIR = "outputs/multirun/${now:%Y-%m-%d_%H-%M-%S}"


def _new_sweep_dir() -> Path:
    """A sweep's own directory, ``outputs/eval/multirun/<date>/<time>`` (``_2``... as
    :func:`new_output_dir`): two sweeps started in the same second never share one."""
    stamp = time.localtime()
    day, now = time.strftime("%Y-%m-%d", stamp), time.strftime("%H-%M-%S", stamp)
    return _unique_dir(OUTPUTS / "multirun" / day / now)


#: What ``--help`` says about the flags, besides the keys.
_HELP_FLAGS = (
    "  --check  # validate and print the resolved configuration; start nothing",
    "  -m / --multirun  # sweep: one evaluation per combination (seed=0,100 env=a,b)",
    "  --cfg job  # print the configuration Hydra composed; start nothing",
    "  --config-dir DIR --config-name NAME  # your own YAML (defaults: [eval, _self_])",
    "  --hydra-help  # Hydra's own flags (hydra.sweep.dir=..., --info, ...)",
)


def _job(cfg: EvalConfig) -> dict[str, Any]:
    """One evaluation (inside Hydra's launcher)."""
    summary = _run(cfg)
    status = exit_status(summary)
    if status:
        print(f"error: {failure_line(summary)}", file=sys.stderr)
        raise SystemExit(status)
    return summary


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
    env_id = preflight(cfg)  # before the server: a bad setting fails in a second, not minutes
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
            policy = _make_policy(cfg.policy, base_url, model, cfg.temperature)
            summary = asyncio.run(run_eval(cfg, policy, env_id=env_id))
        finally:
            for server in servers:
                server.stop()
    hidden = ("dropped", "failed", "tool_error_rates")
    shown = {k: v for k, v in summary.items() if k not in hidden}
    print(json.dumps(shown, indent=2))
    out = Path(cfg.output_dir).resolve()
    print(
        f"results in {out}: summary.json, transcripts.jsonl (one line per episode), "
        f"index.html (open it in a browser), config.yaml"
    )
    return summary


if __name__ == "__main__":
    main()
