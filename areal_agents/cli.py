"""The Hydra application behind ``python -m areal_agents.train`` and ``... .eval``.

Hydra parses the command line (its own flags and the override grammar) and composes the
configuration (:mod:`areal_agents.config`); each job runs through Hydra's launcher, so
``-m``/``--multirun`` sweeps (``-m algo=grpo,rloo trainer.max_staleness=0,2``), ``--cfg job``,
``--config-dir DIR --config-name NAME``, ``--info`` and ``--hydra-help`` work as in any Hydra
app. Around that, the project keeps its own contract:

* ``--help`` lists every key with its default and meaning; ``--check`` validates every job
  (the dataclasses' checks, then the command's own preflight) and starts nothing;
  ``config=FILE.yaml`` loads a plain mapping of keys.
* Every job of a command is built and checked *before* the first one starts: a bad key or
  value in the fourth job of a sweep fails at once with ``error: <key>...`` and exit status 2.
* Hydra never changes the working directory and writes nothing into it: ``hydra.run.dir``
  is the run's own directory (``output_dir``), where Hydra keeps its record under
  ``.hydra/``. In a sweep, a job whose ``output_dir`` is left at its default gets
  ``hydra.sweep.dir/hydra.sweep.subdir`` (the job number) as its own; two jobs that would
  write to the same directory are refused. Hydra's logging set-up is off
  (``hydra/job_logging=none``): the commands log as they did.
* A job's failure does not stop a sweep: the other jobs run, and the command exits with the
  worst status.

* A sweep holds at most :data:`MAX_JOBS` jobs: every job is composed and checked before the
  first starts (Hydra takes 0.1 to 0.7 s a job on a small machine), so
  ``seed=range(0,100000)`` would take hours before anything ran. A larger sweep is refused at
  once, before any job is composed or any range enumerated.

Only Hydra's public API is used: ``hydra.main`` runs the jobs (its application is built around
the command's task function, and sees the command's own argument list as ``sys.argv`` while
it runs, so ``main(argv)`` of the command lines works from Python as it does from a shell),
``hydra.compose``/``hydra.initialize*`` compose a job's configuration, ``ConfigStore`` holds
the dataclasses' defaults, ``HydraConfig`` and ``GlobalHydra`` are the documented singletons,
and the override grammar's parser (``hydra.core.override_parser``, what sweeper plugins use)
expands a sweep. Hydra's flags are parsed here first by a parser of the same flags
(:func:`args_parser`). ``tests/test_hydra_cli.py`` fails if ``areal_agents`` imports a private
Hydra module (``hydra._internal``) or a private name.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import traceback
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from areal_agents.config import (
    build,
    compose,
    config_error,
    prepare_overrides,
    primary,
    split_files,
)
from areal_agents.errors import AgentsError, ConfigError, brief

__all__ = [
    "MAX_JOBS",
    "Command",
    "args_parser",
    "check_sweep_dirs",
    "default_output",
    "job_configs",
    "job_overrides",
    "launch",
    "parse",
]

T = TypeVar("T")

#: The most jobs one ``-m`` sweep may hold (all are composed and checked before the first runs).
MAX_JOBS = 256

#: ``--info``'s choices (Hydra's).
_INFO = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


@dataclass
class Command(Generic[T]):
    """A parsed command line: the project's flags, Hydra's flags and the overrides."""

    cls: type[T]
    """The root config dataclass."""
    overrides: list[str]
    """``key=value`` overrides (Hydra's grammar), after the project's flags were taken out."""
    hydra_args: argparse.Namespace
    """Hydra's own flags (``-m``, ``--cfg``, ``--config-dir``, ...)."""
    parser: argparse.ArgumentParser
    files: list[str] = field(default_factory=list)
    """``config=FILE.yaml`` files, in order."""
    check: bool = False
    """``--check``: validate and print, start nothing."""
    help: bool = False
    """``-h``/``--help``: the project's key listing."""

    @property
    def multirun(self) -> bool:
        return bool(self.hydra_args.multirun)

    @property
    def hydra_only(self) -> bool:
        """Hydra answers this command itself (``--cfg``, ``--info``, ``--hydra-help``)."""
        a = self.hydra_args
        return bool(a.cfg or a.info or a.hydra_help or a.shell_completion)


def parse(cls: type[T], argv: Sequence[str], flags: Mapping[str, str] | None = None) -> Command[T]:
    """Split ``argv`` into the project's flags, Hydra's flags and overrides.

    ``flags`` maps extra flags to overrides (``{"--resume": "resume=true"}``).
    """
    argv = [(flags or {}).get(a, a) for a in argv]
    check = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    files, argv = split_files(argv)
    parser = args_parser()

    def refuse(message: str) -> typing.NoReturn:
        raise ConfigError(f"{message} (--help lists the flags and keys)")

    parser.error = refuse  # type: ignore[method-assign]
    args = parser.parse_intermixed_args(argv)  # `-m` may come anywhere
    modes = [f for f in ("run", "multirun", "cfg", "info", "shell_completion") if getattr(args, f)]
    if len(modes) > 1:
        refuse(f"{' and '.join('--' + m.replace('_', '-') for m in modes)}: choose one")
    if args.resolve and not args.cfg:
        refuse("--resolve goes with --cfg")
    overrides = list(args.overrides)
    return Command(cls, overrides, args, parser, files, check, bool(args.help))


def args_parser() -> argparse.ArgumentParser:
    """The flags of a ``@hydra.main`` application (Hydra's own, with their meaning), and the
    overrides; ``--help`` is the project's key listing."""
    import hydra

    parser = argparse.ArgumentParser(add_help=False, description="Hydra")
    add = parser.add_argument
    add("--help", "-h", action="store_true", help="the keys, their defaults and meaning")
    add("--hydra-help", action="store_true", help="Hydra's help")
    add("--version", action="version", version=f"Hydra {hydra.__version__}")
    add("overrides", nargs="*", help="key=value overrides (Hydra's grammar)")
    add("--cfg", "-c", choices=["job", "hydra", "all"], help="show the config, run nothing")
    add("--resolve", action="store_true", help="with --cfg: resolve interpolations")
    add("--package", "-p", help="with --cfg: the config package to show")
    add("--run", "-r", action="store_true", help="run one job (the default)")
    add("--multirun", "-m", action="store_true", help="sweep: one job per combination")
    add("--shell-completion", "-sc", action="store_true", help="Hydra's shell completion")
    add("--config-path", "-cp", help="a directory of config files (Hydra's search path)")
    add("--config-name", "-cn", help="the primary config's name")
    add("--config-dir", "-cd", help="an extra directory of config files")
    add("--experimental-rerun", help="rerun a job from its config pickle (Hydra's)")
    add("--info", "-i", const="all", nargs="?", choices=_INFO, help="Hydra's information")
    return parser


def _hydra_argv(args: argparse.Namespace) -> list[str]:
    """``args`` (parsed by :func:`args_parser`) as an argument list for ``@hydra.main``: the
    flags first, then the overrides (Hydra parses them with ``parse_args``)."""
    out: list[str] = []
    for name, value in vars(args).items():  # --config-dir is config_dir, and so on
        flag = "--" + name.replace("_", "-")
        if name in ("help", "overrides") or value in (None, False):
            continue
        out += [flag] if value is True else [flag, str(value)]
    return [*out, *args.overrides]


def _config_dir(command: Command[Any]) -> str | None:
    return command.hydra_args.config_dir


def job_overrides(command: Command[Any]) -> list[list[str]]:
    """The overrides of each job: one job, or the cartesian product of a ``-m`` sweep, in the
    order Hydra's basic sweeper runs them (a key given twice keeps its first place and its last
    value). A sweep of more than :data:`MAX_JOBS` jobs is refused before it is expanded."""
    if not command.multirun:
        return [command.overrides]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(command.overrides)
        axes: dict[str, Any] = {}
        for override in parsed:
            key = override.get_key_element()
            if not override.is_sweep_override():
                axes[key] = [f"{key}={override.get_value_element_as_str()}"]
            elif override.is_discrete_sweep():
                axes[key] = override
            else:
                kind = override.value_type.name if override.value_type else "?"
                raise ConfigError(
                    f"{override.input_line}: the basic sweeper enumerates choices (a,b) and "
                    f"ranges (range(0,4)), not {kind}"
                )
        sizes = {k: len(a) if isinstance(a, list) else _sweep_size(a) for k, a in axes.items()}
        total = math.prod(sizes.values())
        if total > MAX_JOBS:
            each = " x ".join(f"{n} {k}" for k, n in sizes.items() if n != 1)
            raise ConfigError(
                f"the sweep has {total} jobs ({each}); one command runs at most {MAX_JOBS}: "
                "split it into several commands"
            )
        for key, axis in axes.items():
            if not isinstance(axis, list):
                axes[key] = [f"{key}={value}" for value in axis.sweep_string_iterator()]
    except ConfigError:
        raise
    except Exception as e:
        raise config_error(e, command.cls) from None
    return [list(job) for job in itertools.product(*axes.values())]


def _sweep_size(override: Any) -> int:
    """How many values a discrete sweep enumerates, counted without enumerating a range."""
    value = override.value()
    start, stop, step = (getattr(value, name, None) for name in ("start", "stop", "step"))
    if override.is_range_sweep() and start is not None and stop is not None and step:
        return max(0, math.ceil((stop - start) / step))
    return sum(1 for _ in itertools.islice(override.sweep_string_iterator(), MAX_JOBS + 1))


def job_configs(command: Command[T]) -> list[T]:
    """Every job's configuration, composed by Hydra and built and validated, or a
    :class:`ConfigError` naming the job's bad key (and the job, in a sweep)."""
    jobs = job_overrides(command)
    out = []
    for num, overrides in enumerate(jobs):
        try:
            node = compose(
                command.cls,
                overrides,
                files=command.files,
                config_dir=_config_dir(command),
                config_name_=command.hydra_args.config_name,
                job_num=num if command.multirun else None,
            )
            out.append(build(command.cls, node))
        except ConfigError as e:
            if len(jobs) == 1:
                raise
            raise ConfigError(f"job {num} ({' '.join(overrides)}): {e}") from None
    return out


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def default_output(command: Command[Any], cfg: Any) -> bool:
    """Whether ``cfg``'s ``output_dir`` is the root's default (a sweep job gets its own)."""
    return bool(getattr(cfg, "output_dir", None) == getattr(command.cls(), "output_dir", None))


def check_sweep_dirs(command: Command[T], configs: Sequence[T]) -> None:
    """Refuse a sweep whose jobs would share a run directory (an ``output_dir`` set for all)."""
    seen: dict[str, int] = {}
    for num, cfg in enumerate(configs):
        if default_output(command, cfg):
            continue
        out = str(Path(str(getattr(cfg, "output_dir", ""))).absolute())
        if out in seen:
            raise ConfigError(
                f"output_dir={getattr(cfg, 'output_dir', '')}: jobs {seen[out]} and {num} of "
                "the sweep would write to the same run directory; leave output_dir unset "
                "(each job gets hydra.sweep.dir/<job number>) or put ${hydra:job.num} in it"
            )
        seen[out] = num


def launch(
    command: Command[T],
    job: Callable[[T], Any],
    *,
    name: str,
    sweep_dir: str,
    run_dir: str | None = None,
) -> list[Any]:
    """Run ``job`` on each job's configuration through Hydra's launcher; the jobs' results.

    ``run_dir`` is ``hydra.run.dir`` of a single run (the run's own directory). A job's
    exception (an :class:`AgentsError`, ``SystemExit``, a bug) is re-raised after a single
    run; after a sweep, each failure is printed and the command exits with the worst status.
    """
    import hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    hydra_node = {
        "job": {"chdir": False, "name": name},
        "output_subdir": ".hydra",
        "run": {"dir": run_dir or "."},
        "sweep": {"dir": sweep_dir, "subdir": "${hydra.job.num}"},
    }
    results: list[Any] = []
    failures: list[tuple[int, BaseException]] = []

    def task(node: Any) -> None:
        num = len(results) + len(failures)
        try:
            cfg = build(command.cls, node)
            if command.multirun and default_output(command, cfg):
                cfg = replace(cfg, output_dir=HydraConfig.get().runtime.output_dir)  # type: ignore[type-var]
            results.append(job(cfg))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # re-raised below (not left to Hydra's own reporting)
            failures.append((num, e))
            if command.multirun and not isinstance(e, AgentsError | SystemExit):
                traceback.print_exception(e)

    config_name = primary(command.cls, command.files, command.hydra_args.config_name, hydra_node)
    overrides = prepare_overrides(command.cls, command.overrides, _config_dir(command))
    if run_dir is not None and not command.multirun:
        overrides.append(f"hydra.run.dir={_quote(run_dir)}")
    args = argparse.Namespace(**vars(command.hydra_args))
    args.overrides, args.config_name = overrides, None  # the primary config is chosen above
    app = hydra.main(config_path=None, config_name=config_name, version_base=None)(task)
    GlobalHydra.instance().clear()
    argv = sys.argv
    sys.argv = [name, *_hydra_argv(args)]  # what @hydra.main parses
    try:
        app()
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
    if failures and not command.multirun:
        raise failures[0][1]
    status = 0
    for num, e in failures:
        code = e.code if isinstance(e, SystemExit) else (2 if isinstance(e, ConfigError) else 1)
        status = max(status, code if isinstance(code, int) else 1)
        if not isinstance(e, SystemExit):
            print(f"error: job {num}: {brief(e)}", file=sys.stderr)
    if status:
        print(
            f"error: {len(failures)} of {len(results) + len(failures)} jobs failed", file=sys.stderr
        )
        raise SystemExit(status)
    return results
