"""Hydra's and OmegaConf's errors as :class:`~areal_agents.errors.ConfigError` messages that
name the key (and, for an unknown key, the nearest known one)."""

import dataclasses
from pathlib import Path
from typing import Any

from areal_agents.config_values import _hints, _is_dataclass_type, group_fields, shorten
from areal_agents.errors import ConfigError, did_you_mean

__all__ = ["config_error"]


def config_error(error: BaseException, cls: type) -> ConfigError:
    """A Hydra or OmegaConf ``error`` as a :class:`ConfigError` that names the key."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    full_key = getattr(error, "full_key", None)
    if first.startswith("Could not override '"):
        key = first.split("'")[1]
        return ConfigError(_unknown_key(cls, key) or first)
    if isinstance(error, OSError) and error.strerror and error.filename:
        return ConfigError(_file_error(cls, error))
    override = getattr(error, "override", None)
    if isinstance(override, str):  # hydra.errors.OverrideParseException
        return ConfigError(
            f"override {override!r} must look like key=value (e.g. trainer.total_steps=10): {first}"
        )
    if first.startswith("Ambiguous value for argument"):
        return ConfigError(f"{first}: quote it, write a list [a,b], or sweep it with -m")
    if first.startswith("In '") and "Could not find" in text:
        return ConfigError(" ".join(line.strip() for line in text.splitlines()[:4] if line))
    if full_key:
        return ConfigError(f"{full_key}: {first}")
    return ConfigError(first)


def _unknown_key(cls: type, key: str) -> str | None:
    tp: Any = cls
    parts = key.split(".")
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(tp)] if _is_dataclass_type(tp) else []
        if part not in names:
            if not names:
                return None
            scope = f" in {'.'.join(parts[:i])!r}" if i else ""
            return f"unknown config key {key!r}{scope}" + did_you_mean(part, names)
        tp = _hints(tp)[part]
    return None


def _file_error(cls: type, error: OSError) -> str:
    """An ``OSError`` of a file Hydra looked for: a config group option is a file name to it
    (``<search path>/model/<option>``), so ``model=<5000 characters>`` fails as ENAMETOOLONG.
    The message names the option, shortened, never Hydra's own search path."""
    path = Path(str(error.filename))
    if _is_dataclass_type(cls) and path.parent.name in group_fields(cls):
        option = path.name.removesuffix(".yaml").replace("%2F", "/")
        return f"{path.parent.name}={shorten(option)}: {error.strerror}"
    return f"{shorten(str(path))}: {error.strerror}"
