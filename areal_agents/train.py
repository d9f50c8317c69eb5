"""``python -m areal_agents.train [key=value ...]``: train a policy on an environment.

Every key of :class:`~areal_agents.trainers.config.TrainConfig` can be set on the command line
(``trainer.total_steps=20``); ``env=``, ``algo=``, ``model=`` and ``inference=`` select presets;
``config=FILE.yaml`` loads a file of keys first (later ``key=value`` overrides win).
``--help`` lists every key with its default and meaning; ``--check`` validates the command
(keys, values, the environment built once, the run directory) and prints the resolved
configuration without starting anything. Re-running the same command after an interruption
(even ``kill -9``) resumes from the last checkpoint; re-running a finished run (same
``output_dir=``) says so and exits 0 without starting anything.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from areal_agents.errors import AgentsError, ConfigError

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

    Finished: the directory this command would resume holds a checkpoint at
    ``trainer.total_steps`` or later, or one whose training time used up
    ``trainer.time_budget_s``. Raises the same :class:`ConfigError` as training would for a
    directory that holds a different run.
    """
    from areal_agents.files import read_json
    from areal_agents.trainers.checkpoint import CheckpointManager
    from areal_agents.trainers.runtime import choose_run_dir

    run_dir, ckpt = choose_run_dir(cfg)
    if ckpt is None:
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
    print("  config=FILE.yaml  # a YAML mapping of keys, loaded before the key=value overrides")
    print("  --check  # validate and print the resolved configuration; start nothing")
    print("\n".join(describe(TrainConfig())))


def main(argv: Sequence[str] | None = None) -> None:
    """Parse overrides, build the config (failing fast on bad keys) and train.

    Exit status: 0 when the run finished (or had finished before), 2 for a configuration
    error, 1 for another :class:`~areal_agents.errors.AgentsError` (the message says which).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    from areal_agents.config import load_config, to_dict
    from areal_agents.trainers.config import TrainConfig

    if any(a in ("-h", "--help") for a in args):
        _help()
        return
    check_only = "--check" in args
    args = [a for a in args if a != "--check"]
    try:
        cfg = load_config(TrainConfig, args)
        preflight(cfg, create_dirs=not check_only)
        done = finished_run(cfg)
    except AgentsError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if check_only:
        import yaml

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        where = f"{done[0]} (already complete)" if done else str(cfg.run_dir())
        print(f"configuration OK (nothing started); the run would go to {where}")
        return
    if done is not None:
        run_dir, step = done
        print(
            f"run in {run_dir} is already complete (step {step}, trainer.total_steps="
            f"{cfg.trainer.total_steps}): nothing to do. Results: {run_dir}/report.html, "
            "summary.json, metrics.jsonl, checkpoints/ (raise trainer.total_steps to continue it, "
            "or give a new output_dir= for a new run)"
        )
        return
    from areal_agents.trainers.loop import train

    try:
        summary = train(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except AgentsError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    run_dir = summary.get("run_dir", cfg.run_dir())
    print(
        f"results in {run_dir}: report.html (open it in a browser), summary.json, "
        "metrics.jsonl, transcripts.jsonl, checkpoints/"
    )


if __name__ == "__main__":
    main()
