"""``python -m areal_agents.train [key=value ...]``: train a policy on an environment.

A Hydra application (:mod:`areal_agents.cli`): every key of
:class:`~areal_agents.trainers.config.TrainConfig` can be set on the command line
(``trainer.total_steps=20``); ``env=``, ``algo=``, ``model=`` and ``inference=`` select config
groups; ``config=FILE.yaml`` loads a file of keys first (later ``key=value`` overrides win);
``-m`` sweeps (``-m algo=grpo,rloo trainer.max_staleness=0,2``: one run per combination, each
in ``hydra.sweep.dir/<job number>`` unless ``output_dir`` says otherwise), ``--cfg job``,
``--config-dir``/``--config-name`` and ``${...}`` interpolation work as in any Hydra app.
``--help`` lists every key with its default and meaning; ``--check`` validates the command
(keys, values, the environment built once, the run directory) and prints the resolved
configuration without starting anything. Re-running the same command after an interruption
(even ``kill -9``) resumes from the last checkpoint; re-running a finished run (same
``output_dir=``) says so and exits 0 without starting anything.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from areal_agents.errors import AgentsError, ConfigError, brief

if TYPE_CHECKING:
    from areal_agents.trainers.config import TrainConfig

__all__ = ["finished_run", "main", "preflight"]


def preflight(cfg: TrainConfig, *, create_dirs: bool = True) -> None:
    """What would fail after start-up, refused now with the key named: the environment is
    built once with its arguments, the run directory must be writable (created unless
    ``create_dirs=False``), and the chat template must be prefix-preserving over multi-turn
    tool dialogues (``model.chat_template``)."""
    from areal_agents.config import writable_dir
    from areal_agents.preflight import check_env
    from areal_agents.trainers.modeling import check_model_template

    check_env(cfg.env.name, cfg.env.make_kwargs(), name_key="env", kwargs_key="env.kwargs")
    writable_dir(cfg.run_dir(), "output_dir", create=create_dirs)
    check_model_template(cfg.model)


def finished_run(cfg: TrainConfig) -> tuple[Path, int] | None:
    """``(run directory, step)`` when ``cfg``'s run already finished, else None.

    Finished: the directory this command would resume holds ``summary.json`` (written last,
    after the held-out evaluation) and a checkpoint at ``trainer.total_steps`` or later, or one
    whose training time used up ``trainer.time_budget_s``. A run stopped after its last step
    but before its summary (killed during the evaluation) is not finished: resuming it trains
    nothing and evaluates. Raises the same :class:`ConfigError` as training would for a
    directory that holds a different run.
    """
    from areal_agents.files import read_json
    from areal_agents.trainers.checkpoint import CheckpointManager
    from areal_agents.trainers.runtime import choose_run_dir

    run_dir, ckpt = choose_run_dir(cfg)
    if ckpt is None or not (run_dir / "summary.json").is_file():
        return None
    step = CheckpointManager.step_of(ckpt)
    if step >= cfg.trainer.total_steps:
        return run_dir, step
    budget = cfg.trainer.time_budget_s
    trainer_state = ckpt / "trainer.json"
    spent = float(read_json(trainer_state).get("elapsed_s", 0.0)) if trainer_state.is_file() else 0
    if budget is not None and spent >= budget:
        return run_dir, step
    return None


def _help() -> None:
    from areal_agents.config import describe
    from areal_agents.trainers.config import TrainConfig

    print(__doc__)
    print("\n".join(_HELP_FLAGS))
    print("\n".join(describe(TrainConfig())))


#: What ``--help`` says about the flags, besides the keys.
_HELP_FLAGS = (
    "  config=FILE.yaml  # a YAML mapping of keys, loaded before the key=value overrides",
    "  --check  # validate and print the resolved configuration; start nothing",
    "  -m / --multirun  # sweep: one job per combination (algo=grpo,rloo trainer.seed=0,1)",
    "  --cfg job  # print the configuration Hydra composed; start nothing",
    "  --config-dir DIR --config-name NAME  # your own YAML (defaults: [train, _self_])",
    "  --hydra-help  # Hydra's own flags (hydra.sweep.dir=..., --info, ...)",
)


#: Run directories this command made itself (Hydra writes ``.hydra/`` into a run's directory
#: before the job starts): a run refused before it started leaves none of them behind.
_MADE_DIRS: set[Path] = set()


def _forget_refused_run() -> None:
    """Remove the run directories this command made, where they hold nothing but Hydra's
    ``.hydra/`` record (or nothing): the run was refused before it wrote anything of its own."""
    for directory in _MADE_DIRS:  # only names _absent could look up
        if directory.is_dir() and all(p.name == ".hydra" for p in directory.iterdir()):
            shutil.rmtree(directory, ignore_errors=True)


def _absent(path: Path) -> bool:
    """Whether ``path`` does not exist yet; a name the system cannot even look up (too long,
    say) counts as present: the command does not make it, and the preflight says why."""
    try:
        return not path.exists()
    except OSError:
        return False


def _job(cfg: TrainConfig) -> dict[str, object]:
    """One training job (inside Hydra's launcher): refuse what would fail, then train."""
    try:
        preflight(cfg)
        done = finished_run(cfg)
    except AgentsError as e:
        print(f"error: {brief(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    if done is not None:
        _say_complete(cfg, *done)
        return {"run_dir": str(done[0])}
    from areal_agents.trainers.loop import train

    try:
        summary = train(cfg)
    except ConfigError as e:
        _forget_refused_run()
        print(f"error: {brief(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    except AgentsError as e:
        print(f"error: {type(e).__name__}: {brief(e)}", file=sys.stderr)
        raise SystemExit(1) from None
    run_dir = summary.get("run_dir", cfg.run_dir())
    print(
        f"results in {run_dir}: report.html (open it in a browser), summary.json, "
        "metrics.jsonl, transcripts.jsonl, checkpoints/"
    )
    return summary


def _say_complete(cfg: TrainConfig, run_dir: Path, step: int) -> None:
    print(
        f"run in {run_dir} is already complete (step {step}, trainer.total_steps="
        f"{cfg.trainer.total_steps}): nothing to do. Results: {run_dir}/report.html, "
        "summary.json, metrics.jsonl, checkpoints/ (raise trainer.total_steps to continue it, "
        "or give a new output_dir= for a new run)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Compose the configuration with Hydra (failing fast on bad keys) and train.

    Exit status: 0 when the run finished (or had finished before), 2 for a configuration
    error, 1 for another :class:`~areal_agents.errors.AgentsError` (the message says which);
    after a ``-m`` sweep, the worst of its jobs'.
    """
    from areal_agents import cli
    from areal_agents.config import to_dict
    from areal_agents.trainers.config import TrainConfig
    from areal_agents.trainers.runtime import choose_run_dir

    args = list(sys.argv[1:] if argv is None else argv)
    _MADE_DIRS.clear()  # this command's own: not those of an earlier call in this process
    try:
        command = cli.parse(TrainConfig, args)
        if command.help:
            _help()
            return
        if command.hydra_only and not command.check:  # with --check: validate and print instead
            cli.launch(command, _job, name="train", sweep_dir=_SWEEP_DIR)
            return
        configs = cli.job_configs(command)
        cli.check_sweep_dirs(command, configs)
        _MADE_DIRS.update(path for path in (Path(c.run_dir()) for c in configs) if _absent(path))
        for cfg in configs:  # a single run's directory is made now: Hydra writes .hydra/ there
            preflight(cfg, create_dirs=not (command.check or command.multirun))
        # a sweep job's directory is its own (hydra.sweep.dir/<job>), not the default one
        done = [None if command.multirun and not c.output_dir else finished_run(c) for c in configs]
        run_dir = None if command.multirun else str(choose_run_dir(configs[0])[0])
        if run_dir is not None and _absent(Path(run_dir)):
            _MADE_DIRS.add(Path(run_dir))
    except AgentsError as e:
        _forget_refused_run()
        print(f"error: {brief(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    if command.check:
        import yaml

        for num, (cfg, finished) in enumerate(zip(configs, done, strict=True)):
            if command.multirun:
                print(f"# job {num}: {' '.join(cli.job_overrides(command)[num])}")
            print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
            where = f"{finished[0]} (already complete)" if finished else str(cfg.run_dir())
            if command.multirun and not cfg.output_dir:
                where = f"hydra.sweep.dir/{num}"
            print(f"configuration OK (nothing started); the run would go to {where}")
        return
    if not command.multirun and done[0] is not None:
        _say_complete(configs[0], *done[0])
        return
    cli.launch(command, _job, name="train", sweep_dir=_SWEEP_DIR, run_dir=run_dir)


#: ``hydra.sweep.dir`` of a ``-m`` sweep: each job's run directory is ``<sweep dir>/<job>``.
_SWEEP_DIR = "runs/multirun/${now:%Y-%m-%d_%H-%M-%S}"


if __name__ == "__main__":
    main()
