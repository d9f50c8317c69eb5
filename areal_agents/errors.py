"""One error hierarchy for the whole package.

Three kinds of failure get three treatments (see DESIGN.md):

* the model's mistakes are never exceptions: environments turn them into observations;
* infrastructure faults derive from :class:`InfrastructureError`: callers retry a bounded
  number of times, then drop the episode and count it (never score it 0);
* configuration and programming errors derive from :class:`ConfigError` /
  :class:`DependencyError` and are raised at once with a message that says what to change.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

__all__ = [
    "AgentsError",
    "CapacityError",
    "ClusterUnreachableError",
    "ConfigError",
    "DependencyError",
    "EndpointError",
    "EpisodeDropped",
    "ImageNotFoundError",
    "InfrastructureError",
    "LearnerLost",
    "MalformedResponseError",
    "RewardTimeout",
    "SandboxError",
    "SandboxUnavailableError",
    "ToolError",
    "ToolTimeout",
    "UnknownEnvironmentError",
    "WeightSyncError",
    "brief",
    "did_you_mean",
    "shorten",
]


class AgentsError(Exception):
    """Root of every error raised on purpose by areal_agents."""


# --- configuration and programming errors -------------------------------------------------


class ConfigError(AgentsError, ValueError):
    """A configuration value is wrong; the message names the key and the fix."""


class ClusterUnreachableError(ConfigError):
    """``ray.address`` names no reachable Ray cluster; the message says what to check."""


class CapacityError(ConfigError):
    """The run's actors do not fit the Ray cluster (or the local instance); the message lists
    what the run needs, what each node has free and the keys to change."""


class UnknownEnvironmentError(ConfigError):
    """An environment name or id is not registered."""


class DependencyError(AgentsError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    @classmethod
    def missing(cls, module: str, extra: str) -> DependencyError:
        return cls(f"{module} is not installed: pip install 'areal-agents[{extra}]'")


# --- the model's mistakes, raised inside tools and turned into observations ---------------


class ToolError(AgentsError):
    """A tool could not do what the model asked. Environments report it back to the model."""


class ToolTimeout(ToolError):
    """A tool's work ran out of its time limit (a program killed for running too long).

    ``output`` is what the model reads (the tool's usual report, partial output included);
    environments count the call as a ``timeout`` tool error.
    """

    def __init__(self, output: str) -> None:
        super().__init__(output)
        self.output = output


# --- infrastructure faults ------------------------------------------------------------------


class InfrastructureError(AgentsError):
    """Something outside the model failed (sandbox, endpoint, weight sync). Retry, then drop."""


class SandboxError(InfrastructureError):
    """The sandbox itself failed (container died, daemon gone), not the program inside it."""


class SandboxUnavailableError(SandboxError):
    """The requested sandbox backend cannot run on this machine."""


class ImageNotFoundError(SandboxError, ConfigError):
    """The sandbox image is missing; the message says how to build it."""


class EndpointError(InfrastructureError):
    """An inference endpoint failed after the allowed retries."""


class MalformedResponseError(EndpointError):
    """An endpoint answered, but not with a well-formed reply (not JSON, no choices, a content
    that is not a string, a body over the size limit, ...): retried, then the episode is dropped."""


class WeightSyncError(InfrastructureError):
    """New weights could not be pushed to an inference server in time."""


class LearnerLost(InfrastructureError):
    """A learner rank died (its process, or its node): the step in progress is lost and the
    run goes back to its last checkpoint."""


class EpisodeDropped(InfrastructureError):
    """An episode could not finish because of an infrastructure fault; it is dropped and counted."""


def shorten(text: str, limit: int = 120) -> str:
    """``text`` for an error message: at most ``limit`` characters, the cut said.

    >>> shorten("x" * 5000, 10)
    'xxxxxxxxxx... (5000 characters)'
    """
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def brief(message: object, limit: int = 120) -> str:
    """``message`` as a refusal prints it: every run of more than ``limit`` characters without a
    space (a value the user typed, a path) shortened by :func:`shorten`, so that a 5000-character
    override is named, not echoed whole, whichever check refused it.

    >>> brief("algo='" + "x" * 5000 + "' is not a known algorithm", 12)
    "algo='xxxxxx... (5007 characters) is not a known algorithm"
    """

    def cut(match: re.Match[str]) -> str:
        word = match.group(0)
        return word if word.endswith("...") else shorten(word, limit)  # shortened already

    return re.sub(rf"\S{{{limit + 1},}}", cut, str(message))


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """A ``" (did you mean 'x'?)"`` suffix for error messages, or ``""``.

    A value that is not a string (a number where a name was expected) has no close spelling.

    >>> did_you_mean("grop", ["grpo", "ppo"])
    " (did you mean 'grpo'?)"
    >>> did_you_mean(5, ["medium", "easy"])  # type: ignore[arg-type]
    ''
    """
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class RewardTimeout(TimeoutError):
    """A reward computation did not finish within its time limit."""
