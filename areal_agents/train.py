"""``python -m areal_agents.train [key=value ...]``: train a policy on an environment.

Every key of :class:`~areal_agents.trainers.config.TrainConfig` can be set on the command line
(``trainer.total_steps=20``); ``env=``, ``algo=``, ``model=`` and ``inference=`` select presets.
``--help`` lists every key with its default and meaning. Re-running the same command after an
interruption (even ``kill -9``) resumes from the last checkpoint.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from areal_agents.errors import AgentsError, ConfigError

if TYPE_CHECKING:
    from areal_agents.trainers.config import TrainConfig

__all__ = ["main", "preflight"]


def _describe(default: Any, prefix: str = "") -> list[str]:
    """One line per config key: ``key = default  # doc`` (docs come from the source)."""
    import ast
    import inspect

    cls = type(default)
    docs: dict[str, str] = {}
    try:
        tree = ast.parse(inspect.getsource(cls))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in itertools.pairwise(body):
            named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            if named and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[node.target.id] = " ".join(str(after.value.value).split())
    except (OSError, TypeError, IndexError):
        pass
    hints = typing.get_type_hints(cls)
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            lines.append(f"{key}=...  # {docs.get(f.name, '')}")
            lines.extend(_describe(getattr(default, f.name), key + "."))
        else:
            lines.append(f"  {key}={getattr(default, f.name)!r}  # {docs.get(f.name, '')}")
    return lines


def preflight(cfg: TrainConfig) -> None:
    """What would fail after start-up, refused now with the key named: the environment is
    built once with its arguments, the run directory must be writable, and the chat template
    must be prefix-preserving over multi-turn tool dialogues (``model.chat_template``)."""
    from areal_agents.config import writable_dir
    from areal_agents.preflight import check_env
    from areal_agents.trainers.modeling import check_model_template

    check_env(cfg.env.name, cfg.env.make_kwargs(), name_key="env", kwargs_key="env.kwargs")
    writable_dir(cfg.run_dir(), "output_dir")
    check_model_template(cfg.model)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse overrides, build the config (failing fast on bad keys) and train.

    Exit status: 0 when the run finished, 2 for a configuration error, 1 for another
    :class:`~areal_agents.errors.AgentsError` (the message says which).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig

    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        print("\n".join(_describe(TrainConfig())))
        return
    try:
        cfg = load_config(TrainConfig, args)
        preflight(cfg)
    except AgentsError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    from areal_agents.trainers.loop import train

    try:
        train(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except AgentsError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
