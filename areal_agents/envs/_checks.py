"""Checks of constructor arguments: a wrong type or range fails at once, naming the key.

Environments are built from command lines and config files, where ``max_turns="3"`` or a
typo is easy to make; the error must say which key and what to write instead, before any
episode starts (a late failure would surface as a tool error the model sees, or at scoring).

>>> check_int("max_turns", "3", minimum=1)
Traceback (most recent call last):
...
areal_agents.errors.ConfigError: max_turns='3': must be an integer (got str)
>>> check_names("tools", "python", ("python", "bash"))
Traceback (most recent call last):
...
areal_agents.errors.ConfigError: tools='python': must be a list of names, e.g. ['python']
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from areal_agents.config import check_timeout
from areal_agents.errors import ConfigError, did_you_mean

__all__ = [
    "check_choice",
    "check_int",
    "check_kwargs",
    "check_names",
    "check_optional_str",
    "check_positive",
    "check_timeout",
    "parameter_names",
]


def check_int(key: str, value: Any, *, minimum: int) -> int:
    """``value`` as an int of at least ``minimum`` (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}={value!r}: must be an integer (got {type(value).__name__})")
    if value < minimum:
        raise ConfigError(f"{key}={value!r}: must be at least {minimum}")
    return value


def check_positive(key: str, value: Any) -> float:
    """``value`` as a positive, finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"{key}={value!r}: must be a positive number (got {type(value).__name__})"
        )
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key}={value!r}: must be a positive number")
    return float(value)


def check_optional_str(key: str, value: Any) -> str | None:
    """``value`` when it is a str or None."""
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{key}={value!r}: must be a string (got {type(value).__name__})")
    return value


def check_choice(key: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` when it is one of ``choices`` (with a did-you-mean hint otherwise)."""
    if not isinstance(value, str) or value not in choices:
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise ConfigError(f"{key}={value!r}{hint}: choose one of {', '.join(choices)}")
    return value


def check_names(
    key: str, value: Any, choices: Sequence[str] | None = None, *, what: str = "name"
) -> tuple[str, ...]:
    """``value`` as a tuple of names (a list or tuple of str, each in ``choices`` if given)."""
    example = [choices[0]] if choices else ["name"]
    if isinstance(value, str) or not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise ConfigError(f"{key}={value!r}: must be a list of names, e.g. {example}")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"{key}: {name!r} is not a name (a string)")
        if choices is not None and name not in choices:
            raise ConfigError(
                f"{key}: unknown {what} {name!r}{did_you_mean(name, choices)}; "
                f"choose from {', '.join(choices)}"
            )
    return names


def check_kwargs(owner: str, unknown: Mapping[str, Any], known: Iterable[str]) -> None:
    """Fail on any key of ``unknown`` (options nobody took), suggesting the closest known one."""
    for key in unknown:
        raise ConfigError(
            f"{owner} got an unknown option {key!r}{did_you_mean(key, list(known))}; "
            f"its options: {', '.join(sorted(known))}"
        )


def parameter_names(*functions: Any) -> list[str]:
    """The keyword parameter names of ``functions`` (for :func:`check_kwargs`)."""
    names: list[str] = []
    for fn in functions:
        for p in inspect.signature(fn).parameters.values():
            keyword = p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            if keyword and p.name != "self" and p.name not in names:
                names.append(p.name)
    return names
