"""Held-out success before and after training, measured the same way, and the closing screen.

The held-out tasks are those ``python -m areal_agents.eval`` plays with ``seed=eval.seed``: task
``i`` is the one ``env.reset(seed=eval.seed + i)`` draws. Their ids are known before anything
starts (:func:`held_out_task_ids`); the rollout workers never train on a task with one of them
(:func:`~areal_agents.trainers.data.avoid_tasks`). :func:`evaluate` runs the eval command's
own machinery (:func:`~areal_agents.eval.run_eval`) against the trainer's inference server,
once per task at ``eval.temperature`` (greedy by default), with the training's per-turn token
limit: before the first step and after the last, into ``<run>/eval/before`` and
``<run>/eval/after`` (each with its ``summary.json``, ``transcripts.jsonl`` and ``index.html``
viewer).

The change between two of these measurements is judged on the same tasks, paired
(:func:`paired_gains`: McNemar's exact test and a paired bootstrap interval,
:mod:`areal_agents.stats`), and ``summary.json`` and the closing screen show it with its
interval, so that a gain can be told from noise.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from areal_agents.envs.registry import make_env
from areal_agents.errors import ConfigError
from areal_agents.files import read_json, read_jsonl
from areal_agents.stats import PairedComparison, compare_paired
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.data import task_family, task_id_of

__all__ = [
    "DEMONSTRATION_SIDES",
    "closing_screen",
    "demonstration_sides",
    "demonstration_split",
    "disk_mb",
    "evaluate",
    "held_out_before",
    "held_out_task_ids",
    "load_result",
    "paired_gains",
    "task_families",
    "task_family",
    "task_successes",
]

logger = logging.getLogger(__name__)


def held_out_task_ids(cfg: TrainConfig) -> frozenset[str] | None:
    """The ids of the tasks training never draws: the ``eval.held_out_tasks`` held-out tasks
    and the ``eval.validation_tasks`` after them (empty when both are 0); None, with a
    warning, for an environment that cannot name its tasks before a reset (no
    ``sample_task``, e.g. a remote one): its held-out tasks are then only different seeds."""
    n = cfg.eval.held_out_tasks + cfg.eval.validation_count
    if n == 0:
        return frozenset()
    env = make_env(cfg.env.name, **cfg.env.make_kwargs())
    try:
        return frozenset(task_id_of(env, cfg.eval.seed + i) for i in range(n))
    except ConfigError as e:
        logger.warning("held-out tasks cannot be kept out of training: %s", e)
        return None
    finally:
        env.close()


def _result(summary: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """The part of an eval summary the closing screen and ``summary.json`` show."""
    return {
        "success": summary.get("pass@1"),
        "mean_reward": summary.get("mean_reward"),
        "episodes": summary.get("episodes"),
        "dropped": summary.get("episodes_dropped"),
        "sampling": summary.get("sampling"),
        "viewer": str(directory / "index.html"),
    }


def evaluate(
    cfg: TrainConfig,
    base_url: str,
    served_name: str,
    directory: Path,
    *,
    tasks: int | None = None,
    first: int = 0,
) -> dict[str, Any]:
    """Play the held-out tasks against ``base_url`` (the trainer's server) into ``directory``, at
    ``eval.temperature`` (greedy by default);
    returns ``success`` (the share of tasks solved, ``pass@1``), ``mean_reward``, ``episodes``,
    ``dropped``, ``sampling`` and ``viewer`` (the transcript viewer's path).
    ``tasks`` and ``first``: play ``tasks`` tasks (default ``eval.held_out_tasks``) from task
    ``first`` on, ``env.reset(seed=eval.seed + first + i)`` (the validation tasks)."""
    from areal_agents.eval import EvalConfig, EvalPolicyConfig, _make_policy, run_eval

    shutil.rmtree(directory, ignore_errors=True)  # a half-written one from a killed run
    directory.mkdir(parents=True)
    ecfg = EvalConfig(
        env=cfg.env.name,
        env_kwargs=cfg.env.make_kwargs(),
        policy=EvalPolicyConfig(
            base_url=base_url,
            model=served_name,
            temperature=cfg.eval.temperature,
            max_tokens=cfg.inference.max_tokens,
            timeout_s=cfg.inference.request_timeout_s,
        ),
        num_episodes=cfg.eval.held_out_tasks if tasks is None else tasks,
        samples_per_task=1,
        seed=cfg.eval.seed + first,
        concurrency=cfg.eval.concurrency,
        output_dir=str(directory),
        progress=cfg.log.progress,
    )
    policy = _make_policy(ecfg.policy, base_url, served_name, ecfg.temperature)
    summary = asyncio.run(run_eval(ecfg, policy))
    return _result(summary, directory)


def load_result(directory: Path) -> dict[str, Any] | None:
    """The result of an evaluation already in ``directory`` (a resumed run's "before"), or
    None when there is none."""
    path = directory / "summary.json"
    return _result(read_json(path), directory) if path.is_file() else None


def task_successes(directory: Path) -> dict[int, bool] | None:
    """Whether each held-out task (by index) was solved, from ``<directory>/transcripts.jsonl``
    (an episode passes at the evaluation's ``pass_threshold``); None when there is none."""
    path = directory / "transcripts.jsonl"
    if not path.is_file():
        return None
    threshold = float(
        (
            read_json(directory / "summary.json") if (directory / "summary.json").is_file() else {}
        ).get("pass_threshold", 1.0)
    )
    out: dict[int, bool] = {}
    for record in read_jsonl(path, torn_ok=True):
        index = int(record["task_index"])
        out[index] = out.get(index, False) or float(record["reward"]) >= threshold
    return out


def task_families(directory: Path) -> dict[int, str]:
    """``{task index: family}`` of the held-out tasks in ``<directory>/transcripts.jsonl`` that
    have one (:func:`task_family`); empty when there is no such file."""
    path = directory / "transcripts.jsonl"
    if not path.is_file():
        return {}
    out: dict[int, str] = {}
    for record in read_jsonl(path, torn_ok=True):
        family = task_family(str(record.get("task_id") or ""))
        if family is not None:
            out[int(record["task_index"])] = family
    return out


def paired_gains(eval_dir: Path, undemonstrated: Collection[str] = ()) -> dict[str, Any]:
    """The paired comparisons of the run's held-out measurements in ``eval_dir`` (``base``,
    ``before``, ``after``, ``last``): ``rl_gain`` (before -> after), ``warm_start_gain``
    (base -> before), ``gain`` (base -> after) and, where validation chose a final policy other
    than the last step's (``trainers/selection.py``), ``rl_gain_last`` (before -> last), each a
    :class:`~areal_agents.stats.PairedComparison`
    as JSON, with the interval by task family where the tasks come in families (the instances
    of one template tend to be solved or failed together); a pair with a measurement missing is
    left out.

    ``undemonstrated``: the task families no demonstration showed
    (``warm_start.exclude_families``); RL's gain is then also split, on the held-out tasks of
    those families (``rl_gain_undemonstrated``: what only the rewards taught) and on the others
    (``rl_gain_demonstrated``)."""
    names = ("base", "before", "after", "last")
    solved = {name: task_successes(eval_dir / name) for name in names}
    families: dict[int, str] = {}
    for name in ("base", "before", "after"):  # the same tasks in each: any one names them
        families = families or task_families(eval_dir / name)
    pairs = {"rl_gain": ("before", "after"), "warm_start_gain": ("base", "before")}
    pairs.update(gain=("base", "after"), rl_gain_last=("before", "last"))
    out: dict[str, Any] = {}
    for key, (a, b) in pairs.items():
        first, second = solved[a], solved[b]
        if first and second and set(first) & set(second):
            out[key] = compare_paired(first, second, families=families).to_json()
    if undemonstrated and "rl_gain" in out:
        out.update(demonstration_split(solved["before"], solved["after"], families, undemonstrated))
    return out


DEMONSTRATION_SIDES: tuple[tuple[str, str], ...] = (
    ("undemonstrated", "families never demonstrated"),
    ("demonstrated", "demonstrated families"),
)
"""The two sides of RL's held-out gain where the warm start left families out
(``warm_start.exclude_families``), in order, and what the closing screen calls each; a side's
``summary.json`` key is ``rl_gain_<side>``."""


def demonstration_sides(
    tasks: Iterable[int], families: Mapping[int, str], undemonstrated: Collection[str]
) -> dict[str, set[int]]:
    """``tasks`` by :data:`DEMONSTRATION_SIDES`: those whose family is in ``undemonstrated``,
    and the rest (a task of no family counts as demonstrated).

    >>> demonstration_sides([1, 2, 3], {1: "gen/a", 2: "gen/b"}, ["gen/a"])
    {'undemonstrated': {1}, 'demonstrated': {2, 3}}
    """
    names, every = frozenset(undemonstrated), set(tasks)  # tasks may be an iterator: read once
    inside = {t for t in every if families.get(t) in names}
    return {"undemonstrated": inside, "demonstrated": every - inside}


def demonstration_split(
    before: Mapping[int, bool] | None,
    after: Mapping[int, bool] | None,
    families: Mapping[int, str],
    undemonstrated: Collection[str],
) -> dict[str, Any]:
    """``rl_gain_undemonstrated`` and ``rl_gain_demonstrated``: the paired change from
    ``before`` to ``after`` on each side of :func:`demonstration_sides`, each as
    :class:`~areal_agents.stats.PairedComparison` JSON; a side with no task is left out."""
    out: dict[str, Any] = {}
    if not before or not after:
        return out
    sides = demonstration_sides(set(before) & set(after), families, undemonstrated)
    for side, tasks in sides.items():
        if tasks:
            out[f"rl_gain_{side}"] = compare_paired(
                {t: before[t] for t in tasks}, {t: after[t] for t in tasks}, families=families
            ).to_json()
    return out


def _paired_line(comparison: dict[str, Any] | None) -> str:
    """``  (+12.5 points, 95% CI +4.7 to +20.3; 8 fixed, 0 broken; McNemar p=0.008)``."""
    if not comparison:
        return ""
    return f"  ({PairedComparison.from_json(comparison).describe()})"


def disk_mb(path: Path) -> float:
    """Megabytes of the files under ``path`` (0 when it does not exist)."""
    if not path.exists():
        return 0.0
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 1)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _gain(old: float | None, new: float | None) -> str:
    return "" if old is None or new is None else f"  ({100 * (new - old):+.1f} points)"


def _sampling(held: Mapping[str, Any]) -> str:
    """How the held-out episodes were sampled, in words: ``greedy`` or ``temperature T``."""
    for when in ("after", "before", "base"):
        temperature = ((held.get(when) or {}).get("sampling") or {}).get("temperature")
        if temperature is not None:
            return "greedy" if float(temperature) == 0.0 else f"temperature {temperature:g}"
    return "greedy"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _selection_lines(held: Mapping[str, Any]) -> list[str]:
    """How the final policy was chosen on validation tasks (``trainers/selection.py``), and what
    the last step's weights scored on the held-out tasks where another was chosen."""
    selection = held.get("selection")
    if not selection:
        return []
    scores = ", ".join(
        f"step {step} {_pct(success)}" for step, success in selection["candidates"].items()
    )
    chosen, last = selection["chosen_step"], selection["last_step"]
    lines = [
        f"  final policy:    step {chosen} of {last}, the best on {selection['tasks']} "
        f"validation tasks ({scores})"
    ]
    if chosen != last and held.get("last"):
        b, z = (held.get("before") or {}).get("success"), held["last"].get("success")
        lines.append(
            f"  RL's last step:  {_pct(b)} -> {_pct(z)}"
            + (_paired_line(held.get("rl_gain_last")) or _gain(b, z))
        )
    return lines


def closing_screen(summary: Mapping[str, Any]) -> str:
    """The lines printed at the end of a run, from its ``summary.json`` contents."""
    run = Path(str(summary.get("run_dir", ".")))
    held = summary.get("held_out") or {}
    before, after = held.get("before") or {}, held.get("after") or {}
    lines = ["", "=" * 72]
    lines.append(
        f"trained {summary.get('steps')} steps ({summary.get('stop_reason')}) of "
        f"{summary.get('env')} with {summary.get('model')}"
    )
    base = held.get("base") or {}
    if held.get("tasks") and base:
        z, b, a = base.get("success"), before.get("success"), after.get("success")
        lines.append(
            f"held-out success ({held['tasks']} tasks never trained on, {_sampling(held)}): "
            f"{_pct(z)} -> {_pct(a)}{_gain(z, a)}"
        )
        lines.append(
            f"  warm start:      {_pct(z)} -> {_pct(b)}{_gain(z, b)}  "
            f"(supervised, {(summary.get('warm_start') or {}).get('steps')} steps)"
        )
        lines.append(
            f"  RL:              {_pct(b)} -> {_pct(a)}"
            + (_paired_line(held.get("rl_gain")) or _gain(b, a))
        )
    elif held.get("tasks"):
        b, a = before.get("success"), after.get("success")
        lines.append(
            f"held-out success ({held['tasks']} tasks never trained on, {_sampling(held)}): "
            f"{_pct(b)} -> {_pct(a)}" + (_paired_line(held.get("rl_gain")) or _gain(b, a))
        )
    else:
        lines.append("held-out success: not measured (eval.held_out_tasks=0)")
    lines.extend(_selection_lines(held))
    for side, words in DEMONSTRATION_SIDES:
        part = held.get(f"rl_gain_{side}")
        if held.get("tasks") and part:  # RL's gain split by warm_start.exclude_families
            lines.append(f"    on {words} ({part.get('n')} tasks):{_paired_line(part)}")
    lines.append(
        f"training reward (mean of a batch): first {summary.get('reward_first')}, "
        f"last {summary.get('reward_last')}"
    )
    lines.append(f"reward curve:      {run / 'summary.png'} (per step: {run / 'metrics.jsonl'})")
    lines.append(f"run directory:     {run} ({summary.get('disk_mb', {}).get('run_dir')} MB)")
    lines.append(f"final weights:     {summary.get('final_weights') or 'n/a'}")
    lines.append(f"report:            {run / 'report.html'} (open it in a browser)")
    viewers = [str(run / "transcripts.html")] + [
        str(r["viewer"]) for r in (base, before, after) if r.get("viewer")
    ]
    lines.append("transcripts:       " + ", ".join(viewers))
    times = summary.get("times") or {}
    training = summary.get("training_s") or {}
    parts = (
        f" (warm start {_duration(training['warm_start'])}, RL {_duration(training['rl'])})"
        if training.get("warm_start")
        else ""
    )
    lines.append(
        f"time:              {_duration(times.get('total_s'))} in all; first trained step "
        f"after {_duration(summary.get('time_to_first_step_s'))} "
        f"({_duration(summary.get('time_to_first_step_without_eval_s'))} without the "
        f"held-out evaluation); training {_duration(training.get('total', summary.get('wall_s')))}"
        f"{parts}; held-out evaluation {_duration(times.get('eval_s'))}"
    )
    lines.append("=" * 72)
    return "\n".join(lines)


def held_out_before(
    cfg: TrainConfig,
    servers: list[Any],
    run_dir: Path,
    model: str = "policy",
    *,
    fresh: bool,
    name: str = "before",
) -> dict[str, Any] | None:
    """Held-out success of the served weights before any step: measured now on a fresh run,
    read back from ``<run>/eval/<name>`` on a resumed one; None with ``eval.held_out_tasks=0``
    or ``eval.before=false``.
    ``name``: ``before`` (the weights RL starts from) or ``base`` (before the warm start)."""
    if not cfg.eval.held_out_tasks or not cfg.eval.before:
        return None
    directory = run_dir / "eval" / name
    if not fresh:
        return load_result(directory)
    return evaluate(cfg, str(servers[0].base_url), model, directory)
