"""Configurations composed by Hydra from the project's dataclasses.

Each component keeps its own config dataclass next to its code; a command line (``train``,
``eval``) names a root dataclass, and Hydra composes it from its defaults, config groups,
config files and ``key=value`` overrides (the full Hydra override grammar: ``+key=``,
``~key``, sweeps with ``-m``, ``${...}`` interpolation).

**Schema.** The dataclasses stay the schema, but they are not handed to OmegaConf as
structured configs: OmegaConf refuses several annotations they use (``Literal``, unions such
as ``float | str``, ``tuple[...]``). :func:`register` stores in Hydra's ``ConfigStore`` plain
defaults derived from them (``to_dict(cls())``), in struct mode, so an unknown key is refused
while Hydra composes; fields typed ``dict`` stay open (``env.kwargs.sandbox=docker``). The
composed result is then turned into the real dataclasses by
:func:`~areal_agents.config_values.from_dict`, which converts every value to its annotated
type and runs ``__post_init__``: all validation stays in the dataclasses.

**Config groups.** A field whose type is a dataclass with a ``from_name`` classmethod is a
Hydra config group (``env``, ``algo``, ``model``, ``inference`` of the trainer). Its options
are the names its ``preset_names()`` lists, each stored as ``from_name(name)``; a name given
on the command line that is not stored yet (``env=acme/MyTask-v0``, ``model=PATH``) is built
by ``from_name`` and stored before Hydra composes, so ``from_name`` still decides what is
valid and says what to choose. Hydra cannot store an option whose name holds ``/``; such a
name is stored with ``%2F`` in its place (``hydra.runtime.choices`` shows that form).

**Config files.** ``config=FILE.yaml`` (a mapping of keys, as written by ``dump_yaml``; a
group key with a plain value, ``algo: grpo``, selects that option) becomes a primary config
whose defaults list is the root's, so its values apply after the groups and before the
command line's overrides. Hydra's own ``--config-dir DIR --config-name NAME`` takes a file
with a defaults list (``defaults: [train, _self_]``, ``- override /env: calculator``).

**What a user gives is checked before Hydra sees it**: ``config=`` files
(:func:`~areal_agents.config_values.read_config_file`), and resolvers in values
(:func:`~areal_agents.config_values.check_interpolations`: ``${key}``, ``${hydra:...}`` and
``${now:...}`` only).

What the home-made parser (replaced by Hydra) did and Hydra does differently, Hydra's way
kept: a value with a comma must be quoted or written as a list (``key=[a,b]``; unquoted
``key=a,b`` is a sweep, which needs ``-m``), and so must one holding other characters of the
override grammar (``[]{}()'"\\``, ``=``); ``${...}`` in a value is an interpolation; a group
option picked inside a user's YAML defaults list must be a stored option (a preset or a name
given on the command line), while other names go in as keys (``env: {name: acme/MyTask-v0}``);
a group selection and that group's keys apply in Hydra's order (the selection first, then
``config=`` files, then keys), whatever their order on the command line.

>>> from dataclasses import dataclass, field
>>> @dataclass
... class Opt:
...     lr: float = 1e-3
...     betas: tuple[float, ...] = (0.9, 0.999)
>>> @dataclass
... class Root:
...     steps: int = 10
...     opt: Opt = field(default_factory=Opt)
>>> load_config(Root, ["steps=3", "opt.lr=0.5", "opt.betas=[0.8,0.9]"])
Root(steps=3, opt=Opt(lr=0.5, betas=(0.8, 0.9)))
>>> load_config(Root, ["steps=${opt.lr}"])  # interpolation, then conversion to int
Traceback (most recent call last):
...
areal_agents.errors.ConfigError: steps: expected an integer, got 0.001
"""

import contextlib
import dataclasses
import functools
import os
import sys
import typing
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from areal_agents.config_errors import config_error
from areal_agents.config_values import (
    _hints,
    _is_dataclass_type,
    _walk_strings,
    check_interpolations,
    check_numbers,
    check_timeout,
    describe,
    dump_yaml,
    from_dict,
    group_fields,
    read_config_file,
    to_dict,
    writable_dir,
)
from areal_agents.errors import ConfigError

if typing.TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "build",
    "check_numbers",
    "check_timeout",
    "compose",
    "config_error",
    "config_name",
    "describe",
    "dump_yaml",
    "from_dict",
    "group_fields",
    "load_config",
    "prepare_overrides",
    "primary",
    "register",
    "split_files",
    "to_dict",
    "writable_dir",
]

T = TypeVar("T")


def config_name(cls: type) -> str:
    """The name of ``cls``'s primary config in the ``ConfigStore``: ``TrainConfig`` -> ``train``."""
    return cls.__name__.removesuffix("Config").lower() or cls.__name__.lower()


def _option(name: str) -> str:
    return name.replace("/", "%2F")


def _node(value: Any) -> Any:
    """``value`` (a dataclass) as an OmegaConf node whose ``dict`` fields accept new keys."""
    from omegaconf import OmegaConf

    node = OmegaConf.create(to_dict(value))
    _open_dicts(type(value), node)
    return node


def _open_dicts(cls: type, node: Any) -> None:
    from omegaconf import OmegaConf

    for name, tp in _hints(cls).items():
        if name not in node:
            continue
        origin = typing.get_origin(tp) or tp
        if origin in (dict, Mapping) and node[name] is not None:
            OmegaConf.set_struct(node[name], False)
        elif _is_dataclass_type(tp) and node[name] is not None:
            _open_dicts(tp, node[name])


#: group -> (its dataclass, the options stored for it); name -> (root, hydra node) registered.
_OPTIONS: dict[str, tuple[type, set[str]]] = {}
_ROOTS: dict[str, tuple[type, str]] = {}


def _store_option(group: str, tp: type, name: str, value: Any) -> str:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    owner, options = _OPTIONS.get(group, (tp, set()))
    if owner is not tp:  # another root's group of the same name: start the group afresh
        store.repo.pop(group, None)
        options = set()
    option = _option(name)
    store.store(group=group, name=option, node=_node(value), package=group)
    _OPTIONS[group] = (tp, options | {option})
    return option


def _stored(group: str, tp: type, option: str) -> bool:
    owner, options = _OPTIONS.get(group, (None, set()))
    return owner is tp and option in options


def register(cls: type, hydra: Mapping[str, Any] | None = None) -> str:
    """Store ``cls``'s defaults and its config groups' options in Hydra's ``ConfigStore``.

    Returns the primary config's name (:func:`config_name`). ``hydra`` is merged into the
    ``hydra`` node of that config (run and sweep directories, for the command lines).
    """
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    name = config_name(cls)
    key = (cls, repr(hydra))
    groups = group_fields(cls)
    mine = {g: owner for g, (owner, _) in _OPTIONS.items()} == groups
    if _ROOTS.get(name) == key and mine:
        return name
    for other in set(_OPTIONS) - set(groups):  # another root's group: here it is a plain key
        del _OPTIONS[other]
        ConfigStore.instance().repo.pop(other, None)
    default = cls()
    defaults: list[Any] = ["_self_"]
    for group, tp in groups.items():
        value = getattr(default, group)
        names = list(getattr(tp, "preset_names", tuple)())
        presets = {n: _preset(cls, group, n)[0] for n in names}
        choice = next((n for n in names if presets[n] == value), None)
        _OPTIONS.pop(group, None)
        ConfigStore.instance().repo.pop(group, None)
        for option in names:
            _store_option(group, tp, option, presets[option])
        if choice is None:
            choice = str(getattr(value, "name", "default"))
            _store_option(group, tp, choice, value)
        defaults.append({group: _option(choice)})
    node = _node(default)
    for group in groups:
        del node[group]
    if hydra is not None:
        defaults += [
            {"override hydra/job_logging": "none"},
            {"override hydra/hydra_logging": "none"},
        ]
        node.hydra = OmegaConf.create(dict(hydra))
    node.defaults = defaults
    ConfigStore.instance().store(name=name, node=node)
    _ROOTS[name] = key
    return name


def _preset(cls: type, group: str, name: str) -> tuple[Any, dict[str, str]]:
    """The option ``name`` of ``cls``'s config group ``group``, and notes (key -> text) on
    what it changed.

    A group whose dataclass has ``with_preset`` (``inference``) moves the root's default section
    to the option, keeping what the option accepts (``inference=vllm`` keeps the recipe's
    ``inference.max_tokens``); any other group's option is ``from_name(name)``. A
    :class:`ConfigError` (or ``from_name``'s ``TypeError``/``ValueError``) names ``group``.
    """
    tp = group_fields(cls)[group]
    try:
        if hasattr(tp, "with_preset"):
            value, notes = getattr(_root_default(cls), group).with_preset(name)
            return value, dict(notes)
        return tp.from_name(name), {}  # type: ignore[attr-defined]
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{group}={name!r}: {e}") from None


@functools.cache
def _root_default(cls: type) -> Any:
    return cls()


_SAID: set[str] = set()


def _note(notes: Mapping[str, str], group: str, explicit: Collection[str]) -> None:
    """Print each note once per process (``note: ...`` on stderr), except those on a key the
    user sets (``explicit``): the user's value is then checked as given."""
    for key, text in notes.items():
        if f"{group}.{key}" not in explicit and text not in _SAID:
            _SAID.add(text)
            print(f"note: {text}", file=sys.stderr)


def _key_type(cls: type, key: str) -> Any:
    """The annotated type at the dotted ``key`` of ``cls``, or None when there is none."""
    tp: Any = cls
    for part in key.split("."):
        if not _is_dataclass_type(tp):
            return None
        tp = _hints(tp).get(part)
        if tp is None:
            return None
    return tp


def prepare_overrides(
    cls: type, overrides: Sequence[str], config_dir: str | os.PathLike[str] | None = None
) -> list[str]:
    """Check ``overrides`` against ``cls`` and store every group option they name.

    ``env=acme/MyTask-v0`` is built by ``EnvConfig.from_name`` and stored (and rewritten to
    the stored name when that differs); a bad option raises ``from_name``'s
    :class:`ConfigError`. An option with a file in ``config_dir/<group>/`` is left to Hydra.
    A plain value for a section that is not a group (``trainer=fast``) is refused.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = group_fields(cls)
    parser = OverridesParser.create()
    explicit = {parser.parse_overrides([text])[0].key_or_group for text in overrides}
    out: list[str] = []
    for text in overrides:
        override = parser.parse_overrides([text])[0]
        key = override.key_or_group
        check_interpolations(text, key)
        if override.package is not None or override.is_delete():
            out.append(text)
            continue
        group, _, sub = key.partition(".")
        if sub and sub == getattr(groups.get(group), "PRESET_KEY", None) and text[0] not in "+~":
            # inference.engine=vllm is inference=vllm: the section moved to that engine
            text = f"{group}={text.split('=', 1)[1]}"
            override, key = parser.parse_overrides([text])[0], group
        if key not in groups:
            tp = _key_type(cls, key)
            value = None if override.is_sweep_override() else override.value()
            if _is_dataclass_type(tp) and not isinstance(value, Mapping | type(None)):
                fields = [f.name for f in dataclasses.fields(tp)]
                raise ConfigError(
                    f"{key}={value!r}: {key} is a section; set one of its keys: {fields}"
                )
            out.append(text)
            continue
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                out.append(text)
                continue
            names = [str(v) for v in override.sweep_string_iterator()]
        else:
            names = [str(override.value())]
        options = []
        for name in names:
            if config_dir is not None and (Path(config_dir) / key / f"{name}.yaml").is_file():
                options.append(name)
                continue
            value, notes = _preset(cls, key, name)
            _note(notes, key, explicit)
            if _stored(key, groups[key], _option(name)):
                options.append(_option(name))
            else:
                options.append(_store_option(key, groups[key], name, value))
        if options == names:
            out.append(text)
        else:
            prefix = text[: len(text) - len(text.lstrip("+"))]
            out.append(f"{prefix}{key}={','.join(options)}")
    return out


def _file_primary(cls: type, base: str, files: Sequence[str]) -> str:
    """``config=FILE.yaml`` files as a primary config that extends ``base``; its name."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    data: dict[str, Any] = {}
    for file in files:
        data = _merge(data, read_config_file(file))
    defaults: list[Any] = [base]
    for group, tp in group_fields(cls).items():
        section, name = data.get(group), None
        if isinstance(section, str):
            name = data.pop(group)
        elif isinstance(section, Mapping) and isinstance(
            section.get(getattr(tp, "PRESET_KEY", None)), str
        ):  # {inference: {engine: vllm, ...}} chooses the engine's option, then sets the keys
            section = dict(section)
            name = section.pop(tp.PRESET_KEY)  # type: ignore[attr-defined]
            data[group] = section
        if name is not None:
            option = _option(name)
            value, notes = _preset(cls, group, name)
            _note(notes, group, {f"{group}.{k}" for k in section or ()})
            if not _stored(group, tp, option):
                _store_option(group, tp, name, value)
            defaults.append({f"override /{group}": option})
    node = OmegaConf.create(data)
    _open_dicts(cls, node)
    node.defaults = [*defaults, "_self_"]
    name = f"{base}_file"
    ConfigStore.instance().store(name=name, node=node)
    return name


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def primary(
    cls: type,
    files: Sequence[str] = (),
    config_name_: str | None = None,
    hydra: Mapping[str, Any] | None = None,
) -> str:
    """Register ``cls`` (and the ``config=`` ``files``) and name the primary config to use."""
    name = register(cls, hydra)
    if files and config_name_:
        raise ConfigError("config=FILE.yaml and --config-name: choose one")
    if files:
        return _file_primary(cls, name, files)
    return config_name_ or name


def compose(
    cls: type,
    overrides: Sequence[str] = (),
    *,
    files: Sequence[str] = (),
    config_dir: str | os.PathLike[str] | None = None,
    config_name_: str | None = None,
    job_num: int | None = None,
) -> "DictConfig":
    """Hydra's composition of ``cls`` with ``overrides`` (a ``DictConfig``, not yet checked).

    ``config_dir`` and ``config_name_`` are Hydra's ``--config-dir`` and ``--config-name``.
    The ``hydra`` node is taken out and made current (``HydraConfig``), with ``job_num`` as
    ``hydra.job.num``, so ``${hydra:...}`` interpolations resolve as they will in the job.
    Every Hydra or OmegaConf error is raised as a :class:`ConfigError` naming the key.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    try:
        name = primary(cls, files, config_name_)
        prepared = prepare_overrides(cls, overrides, config_dir)
        GlobalHydra.instance().clear()
        context: contextlib.AbstractContextManager[Any]
        if config_dir is not None:
            context = initialize_config_dir(str(Path(config_dir).absolute()), version_base=None)
        else:
            context = initialize(config_path=None, version_base=None)
        with context:
            node = hydra_compose(name, overrides=prepared, return_hydra_config=True)
        with open_dict(node):
            if job_num is not None:
                node.hydra.job.num = job_num
            HydraConfig.instance().set_config(node)
            del node["hydra"]
        if config_dir is not None:  # the user's own YAML, read by Hydra
            _walk_strings(OmegaConf.to_container(node, resolve=False), check_interpolations)
        return node
    except ConfigError:
        raise
    except Exception as e:
        raise config_error(e, cls) from None


def build(cls: type[T], node: Any) -> T:
    """The dataclass ``cls`` from a composed ``node``: interpolations resolved, every value
    converted to its field's type, ``__post_init__`` run."""
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(node, resolve=True)
    except Exception as e:
        raise config_error(e, cls) from None
    assert isinstance(data, dict)
    data.pop("hydra", None)
    return from_dict(cls, {str(k): v for k, v in data.items()})


def split_files(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(config=FILE paths, the other arguments)`` of ``argv``."""
    files = [a.split("=", 1)[1] for a in argv if a.startswith("config=")]
    return files, [a for a in argv if not a.startswith("config=")]


def load_config(cls: type[T], argv: Sequence[str] = ()) -> T:
    """Compose ``cls`` with Hydra from its defaults, ``config=FILE.yaml`` files and
    ``key=value`` overrides, then build and validate it (:func:`build`)."""
    files, overrides = split_files(list(argv))
    return build(cls, compose(cls, overrides, files=files))
