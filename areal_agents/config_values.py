"""The typed values of a configuration: conversion, checks, YAML and ``--help`` lines.

Hydra (:mod:`areal_agents.config`) composes a configuration as plain data; this module turns
that data into the project's dataclasses and checks it. :func:`from_dict` converts every value
to its field's annotated type (``Literal``, unions, tuples, ``Path`` — the annotations
OmegaConf's structured configs refuse) and runs each dataclass's ``__post_init__``, so a bad
key or value fails at start-up with its name. :func:`check_numbers` is the validation every
section shares: no NaN or infinity anywhere, no negative number unless the section declares
the key signed, and durations (keys ending in ``_s``) positive.

What a user gives is read defensively. :func:`read_config_file` reads ``config=FILE.yaml``: at
most 1 MiB, UTF-8, plain YAML (no ``!!python`` tags), at most :data:`MAX_CONFIG_VALUES` values
once YAML aliases are expanded (an alias bomb of a few hundred bytes stands for billions) and
:data:`MAX_CONFIG_DEPTH` levels, a mapping whose keys are names; its errors never quote the
file (``config=/etc/shadow`` is not a config file, and its lines are no one's business).
:func:`check_interpolations` refuses OmegaConf resolvers in a value the user gives (command
line, config files): ``${key}`` references and Hydra's ``${hydra:...}`` and ``${now:...}`` are
kept; ``${oc.env:...}`` would copy the environment (secrets included) into the run's
``config.yaml`` and reports, and ``${oc.decode:...}``/``${oc.create:...}`` would parse text
into values past these checks.

>>> from dataclasses import dataclass, field
>>> @dataclass
... class Opt:
...     lr: float = 1e-3
...     betas: tuple[float, ...] = (0.9, 0.999)
>>> @dataclass
... class Root:
...     steps: int = 10
...     opt: Opt = field(default_factory=Opt)
>>> from_dict(Root, {"steps": "3", "opt": {"lr": 0.5, "betas": [0.8, 0.9]}})
Root(steps=3, opt=Opt(lr=0.5, betas=(0.8, 0.9)))
"""

import ast
import dataclasses
import inspect
import itertools
import math
import os
import re
import tempfile
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar, Union

import yaml

from areal_agents.errors import ConfigError, did_you_mean, shorten
from areal_agents.files import atomic_write

__all__ = [
    "ALLOWED_RESOLVERS",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_VALUES",
    "check_interpolations",
    "check_numbers",
    "check_timeout",
    "describe",
    "dump_yaml",
    "from_dict",
    "group_fields",
    "read_config_file",
    "shorten",
    "to_dict",
    "writable_dir",
]

T = TypeVar("T")
_NONE_WORDS = {"none", "null", "~"}


def to_dict(cfg: Any) -> Any:
    """A dataclass tree as plain dicts, lists and scalars (what ``config.yaml`` holds)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple | list):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, Mapping):
        return {str(k): to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, Path):
        return str(cfg)
    return cfg


def dump_yaml(cfg: Any, path: str | os.PathLike[str]) -> None:
    """Write ``cfg`` as YAML, atomically (:func:`~areal_agents.files.atomic_write`)."""
    atomic_write(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def check_numbers(
    cfg: Any, section: str = "", *, signed: Collection[str] = (), zero_ok: Collection[str] = ()
) -> None:
    """Reject meaningless numbers in the fields of the dataclass ``cfg``, naming the key.

    Every ``int``/``float`` field (and every number in a tuple or list field) must be finite;
    it must not be negative unless its name is in ``signed``; and a duration — a field whose
    name ends in ``_s`` — must be positive (0 allowed for names in ``zero_ok``, e.g. a retry
    delay). ``None`` (an unset optional) and booleans pass;
    nested dataclasses and mappings are left to their own checks. ``section`` prefixes the
    key in messages (``trainer`` gives ``trainer.lr=nan``).
    """
    prefix = f"{section}." if section else ""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        items = list(value) if isinstance(value, tuple | list) else [value]
        for item in items:
            if not isinstance(item, int | float) or isinstance(item, bool):
                continue
            key = f"{prefix}{f.name}={_show(value)}"
            if not math.isfinite(item):
                raise ConfigError(f"{key}: must be a finite number")
            if f.name.endswith("_s") and (item < 0 or (item == 0 and f.name not in zero_ok)):
                raise ConfigError(f"{key}: a duration must be positive seconds")
            if item < 0 and f.name not in signed:
                raise ConfigError(f"{key}: must not be negative")


def _show(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)


def writable_dir(path: str | os.PathLike[str], key: str, *, create: bool = True) -> Path:
    """Create the directory ``path`` (with parents) and check that files can be written there.

    Raises :class:`ConfigError` naming ``key`` instead of an ``OSError`` from deep inside a
    run (``output_dir=/proc/nope``, a read-only mount, a path through a file, a name longer
    than the file system allows). With ``create=False`` nothing is created: a missing ``path``
    passes when its nearest existing ancestor is a directory this process may write into (what
    ``--check`` uses).
    """
    shown = shorten(os.fspath(path))
    out = Path(os.path.expanduser(os.fspath(path)))
    try:
        if not create and not out.exists():
            parent = out.absolute()
            while not parent.exists():
                parent = parent.parent
            if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError(
                    f"{key}={shown}: cannot write there ({shorten(str(parent))} is not a "
                    "writable directory); choose a writable directory"
                )
            return out
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(
            f"{key}={shown}: cannot write there ({reason}); choose a writable directory"
        ) from None
    return out


#: The largest ``config=FILE.yaml`` read.
MAX_CONFIG_BYTES = 1 << 20
#: The most values a config file may hold, each YAML alias counted every time it is used.
MAX_CONFIG_VALUES = 100_000
#: The deepest nesting of a config file's values.
MAX_CONFIG_DEPTH = 64
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def read_config_file(file: str) -> dict[str, Any]:
    """The mapping of keys in ``config=FILE.yaml`` (see the module docstring), or a
    :class:`ConfigError` that says what is wrong without quoting the file."""
    where = f"config={shorten(file)}"
    path = Path(file)
    try:
        if not path.exists():
            raise ConfigError(f"{where}: no such file")
        if not path.is_file():
            raise ConfigError(f"{where}: not a regular file")
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or type(e).__name__})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte {e.start})") from None
    try:
        loaded = yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader: plain YAML only
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{where}: not valid YAML{at}: {_problem(e.problem)}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML ({type(e).__name__})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    _check_size(loaded, where)
    if loaded is None:
        return {}
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"{where}: the file must hold a mapping of keys (trainer: ..., env: ...)")
    if not all(isinstance(k, str) and _NAME.fullmatch(k) for k in loaded):
        raise ConfigError(
            f"{where}: not a config file: its keys must be names (trainer, env, output_dir...)"
        )
    _walk_strings(loaded, lambda text, key: check_interpolations(text, f"{where}: {key}"))
    return dict(loaded)


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in a mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[str] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    name = key.value if _NAME.fullmatch(key.value) else "a key"
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{name} is given twice", key.start_mark
                    )
                seen.add(key.value)
        return super().construct_mapping(node, deep=deep)


def _problem(text: str | None) -> str:
    """PyYAML's ``problem``, its quotes of the file left out (a tag's name is kept)."""

    def keep(match: re.Match[str]) -> str:
        quoted = match.group(0)[1:-1]
        return match.group(0) if quoted.startswith(("!", "tag:")) and len(quoted) < 80 else "'...'"

    return _QUOTED.sub(keep, text or "a syntax error")


def _check_size(data: Any, where: str) -> None:
    """Refuse ``data`` if it holds more than :data:`MAX_CONFIG_VALUES` values (an alias
    counted each time it is used) or nests deeper than :data:`MAX_CONFIG_DEPTH`."""
    stack = [(data, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"{where}: more than {MAX_CONFIG_VALUES} values once its YAML aliases are "
                "expanded: not a config file"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {MAX_CONFIG_DEPTH} levels")
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1) for item in value.items() for v in item)
        elif isinstance(value, list | tuple | set):
            stack.extend((v, depth + 1) for v in value)


def _walk_strings(data: Any, check: Any, key: str = "") -> None:
    if isinstance(data, str):
        check(data, key or "value")
    elif isinstance(data, Mapping):
        for k, v in data.items():
            sub = f"{key}.{k}" if key else str(k)
            _walk_strings(k, check, sub)
            _walk_strings(v, check, sub)
    elif isinstance(data, list | tuple):
        for i, v in enumerate(data):
            _walk_strings(v, check, f"{key}[{i}]")


#: The OmegaConf resolvers a user's value may call: Hydra's own (``${hydra:job.num}``) and the
#: time (``${now:%H-%M}``). ``${key}`` references are always allowed.
ALLOWED_RESOLVERS = ("hydra", "now")
_RESOLVER = re.compile(r"\$\{\s*([^\s:{}'\"\\]+)\s*:")


def check_interpolations(value: str, key: str) -> None:
    """Refuse a resolver call other than :data:`ALLOWED_RESOLVERS` in ``value`` (what the user
    gave for ``key``; see the module docstring for why).

    >>> check_interpolations("runs/${env.name}-${hydra:job.num}", "output_dir")
    >>> check_interpolations("${oc.env:HOME}", "output_dir")
    Traceback (most recent call last):
    ...
    areal_agents.errors.ConfigError: output_dir: ${oc.env:...} is not allowed in a value: only \
${key} references and the resolvers hydra, now are; write the value itself (the shell expands $HOME)
    """
    for name in _RESOLVER.findall(value):
        if name not in ALLOWED_RESOLVERS:
            raise ConfigError(
                f"{key}: ${{{shorten(name, 40)}:...}} is not allowed in a value: only ${{key}} "
                f"references and the resolvers {', '.join(ALLOWED_RESOLVERS)} are; write the "
                "value itself (the shell expands $HOME)"
            )


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp) and isinstance(tp, type)


def group_fields(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that are config groups (a dataclass with ``from_name``)."""
    hints = _hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if _is_dataclass_type(hints[f.name]) and hasattr(hints[f.name], "from_name")
    }


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert ``value`` (a CLI string or a YAML scalar) to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in _NONE_WORDS)
        if is_none and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: cannot use {value!r}")
    if origin is typing.Literal:
        for choice in args:
            if value == choice or str(value) == str(choice):
                return choice
        raise ConfigError(
            f"{key}={value!r} is not allowed; choose one of {list(args)}"
            + did_you_mean(str(value), [str(a) for a in args])
        )
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, Mapping):
            return from_dict(tp, value, prefix=key)
        if isinstance(value, tp):
            return value
        raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {value!r}")
    if isinstance(value, str) and tp is not str:
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"{key}: cannot parse {value!r}: {e}") from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin in (tuple, list):
        if value is None:
            value = []
        if isinstance(value, str | int | float):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict or origin is Mapping:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Path:
        return Path(str(value))
    return value


def from_dict(cls: type[T], data: Mapping[str, Any], *, prefix: str = "") -> T:
    """Build ``cls`` from a (possibly partial) nested mapping, converting every value.

    Unknown keys are refused with a suggestion; a nested dataclass is built from its own
    mapping; each dataclass's ``__post_init__`` runs, and its ``TypeError``/``ValueError``
    becomes a :class:`ConfigError` that names the section.
    """
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints or key not in names:
            raise ConfigError(f"unknown config key {path!r}" + did_you_mean(str(key), names))
        kwargs[key] = _coerce(value, hints[key], path)
    return _construct(cls, kwargs, prefix)


def _construct(cls: type[T], kwargs: dict[str, Any], prefix: str) -> T:
    """``cls(**kwargs)``, with its own validation errors turned into named ConfigErrors."""
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def check_timeout(key: str, value: Any) -> float:
    """``value`` as a positive, finite number of seconds, or a ConfigError naming ``key``.

    >>> check_timeout("timeout_s", 2)
    2.0
    >>> check_timeout("timeout_s", "10")
    Traceback (most recent call last):
    ...
    areal_agents.errors.ConfigError: timeout_s='10': must be a positive number of seconds (got str)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"{key}={value!r}: must be a positive number of seconds (got {type(value).__name__})"
        )
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key}={value!r}: must be a positive number of seconds")
    return float(value)


def describe(default: Any, prefix: str = "") -> list[str]:
    """What ``--help`` lists: one line per key of the config ``default``, ``key=default  # doc``.

    Docs are the string literal under each field in the class's source (CleanRL's ``Args``
    style); a nested config is a header line followed by its own keys.

    >>> from areal_agents.eval_config import EvalPolicyConfig
    >>> print(describe(EvalPolicyConfig())[2])
      api_key=''  # Empty reads ``AREAL_API_KEY`` / ``OPENAI_API_KEY`` from the environment.
    """
    cls = type(default)
    docs: dict[str, str] = {}
    try:
        tree = ast.parse(inspect.getsource(cls).strip())
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in itertools.pairwise(body):
            named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            if named and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[node.target.id] = " ".join(str(after.value.value).split())
    except (OSError, TypeError, IndexError, SyntaxError):
        pass
    hints = typing.get_type_hints(cls)
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        doc = docs.get(f.name, "")
        if dataclasses.is_dataclass(tp):
            lines.append(f"{key}=...  # {doc}".rstrip(" #"))
            lines.extend(describe(getattr(default, f.name), key + "."))
        else:
            lines.append(f"  {key}={getattr(default, f.name)!r}  # {doc}".rstrip(" #"))
    return lines
