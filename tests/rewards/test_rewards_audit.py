"""The audit in ``areal_agents/rewards/__init__.py`` stays true (issue 28: "list what each one
evaluates, and where").

It names every reasoning-gym dataset the project offers exactly once, and the datasets whose
scorer calls ``eval`` or sympy's ``parse_expr`` (found here by reading the scorer's source and
the reasoning-gym functions and methods it calls) are the ones it lists as guarded.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from typing import Any

from reasoning_gym.factory import DATASETS

import areal_agents.rewards

_EVALUATES = re.compile(r"(?<![\w.])eval\(|parse_expr\(")
_CALLED = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\(|self\.(\w+)\(")


def _section() -> list[str]:
    """The bullets of the docstring's list of datasets, one string each."""
    doc = areal_agents.rewards.__doc__ or ""
    text = doc[
        doc.index("Reasoning-gym's datasets") : doc.index("``tests/rewards/test_rewards_audit")
    ]
    return [" ".join(b.split()) for b in re.split(r"\n\* ", text)[1:]]


def _named(bullet: str) -> list[str]:
    return [n for n in re.findall(r"``(\w+)``", bullet) if n in DATASETS]


def _scorer_source(cls: type) -> str:
    """The source of ``cls.score_answer`` and of the reasoning-gym code it calls, a few levels
    deep (functions of its module, methods of its class)."""
    fn = next(k.__dict__["score_answer"] for k in cls.__mro__ if "score_answer" in k.__dict__)
    seen: set[int] = set()
    parts: list[str] = []
    stack: list[tuple[Any, int]] = [(fn, 0)]
    while stack:
        current, depth = stack.pop()
        if id(current) in seen or depth > 4:
            continue
        seen.add(id(current))
        try:
            source = inspect.getsource(current)
        except (OSError, TypeError):
            continue
        parts.append(source)
        scope = getattr(current, "__globals__", None) or vars(sys.modules[current.__module__])
        for plain, method in _CALLED.findall(source):
            found = scope.get(plain) if plain else getattr(cls, method, None)
            module = getattr(found, "__module__", "") or ""
            if isinstance(found, types.FunctionType | type) and module.startswith("reasoning_gym"):
                stack.append((found, depth + 1))
    return "\n".join(parts)


def test_every_dataset_is_listed_once() -> None:
    named = [n for bullet in _section() for n in _named(bullet)]
    assert sorted(named) == sorted(DATASETS)


def _guarded(bullet: str) -> set[str]:
    """The datasets a bullet says evaluate under the guard: all of them when its lead says so,
    else those followed by a parenthesis that says so."""
    found = list(re.finditer(r"``(\w+)``", bullet))
    names = [m for m in found if m.group(1) in DATASETS]
    if not names:
        return set()
    if "guarded" in bullet[: names[0].start()]:
        return {m.group(1) for m in names}
    marked = set()
    for m in names:
        after = bullet[m.end() :].lstrip()
        if after.startswith("(") and "guarded" in after.split(")")[0]:
            marked.add(m.group(1))
    return marked


def test_the_scorers_that_evaluate_text_are_the_ones_listed_as_guarded() -> None:
    guarded = {n for bullet in _section() for n in _guarded(bullet)}
    evaluating = {n for n, (cls, _) in DATASETS.items() if _EVALUATES.search(_scorer_source(cls))}
    assert evaluating == guarded
