"""Text from a grade that is always safe to show: never raises, always valid UTF-8.

Its own module so that :mod:`areal_agents.rewards.base` and the grading pool
(:mod:`areal_agents.rewards._pool`, :mod:`areal_agents.rewards._protocol`) can both use it
without importing each other.
"""

from __future__ import annotations

__all__ = ["error_text", "safe_text"]


def error_text(error: BaseException, limit: int = 500) -> str:
    """``"Type: message"`` of an exception, for a result's details: never raises (a message
    built from a huge int, a ``__str__`` that fails) and is always valid UTF-8 (surrogates
    escaped)."""
    try:
        text = f"{type(error).__name__}: {error}"
    except BaseException:
        text = type(error).__name__
    return safe_text(text, limit)


def safe_text(text: str, limit: int = 500) -> str:
    """``text`` cut to ``limit`` characters, lone surrogates escaped (``\\udc80``)."""
    return text[:limit].encode("utf-8", "backslashreplace").decode("utf-8")
