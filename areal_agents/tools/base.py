"""The Tool contract: a name, a description, JSON-schema parameters, and a call that returns text.

A tool signals the model's mistakes (bad input, failing code) by raising
:class:`~areal_agents.errors.ToolError` or by returning text that says so; the environment turns
both into the next observation. Infrastructure faults (a dead sandbox) raise
:class:`~areal_agents.errors.InfrastructureError` and end the episode as dropped.

>>> def add(a: int, b: int) -> str:
...     return str(a + b)
>>> tool = FunctionTool(add, "add", "Add two integers.", {
...     "type": "object",
...     "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
...     "required": ["a", "b"]})
>>> tool.call({"a": 2, "b": 3})
'5'
>>> validate_arguments(tool.spec, {"a": "2"})
"missing required argument 'b'; argument 'a': '2' is not of type 'integer'"
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import jsonschema

from areal_agents.types import ToolSpec

__all__ = ["FunctionTool", "Tool", "call_tool", "validate_arguments"]


@runtime_checkable
class Tool(Protocol):
    """Anything with a :class:`ToolSpec` and a ``call`` that maps arguments to text."""

    @property
    def spec(self) -> ToolSpec:
        """The schema shown to the model."""
        ...

    def call(self, arguments: Mapping[str, Any]) -> str:
        """Run the tool on already-validated arguments and return the text the model sees."""
        ...


@functools.cache
def _takes_timeout(tool_type: type) -> bool:
    try:
        parameters = inspect.signature(tool_type.call).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError, AttributeError):
        return False
    return "timeout_s" in parameters


def call_tool(tool: Tool, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> str:
    """``tool.call(arguments)``, passing ``timeout_s`` on when the tool's ``call`` takes it.

    A tool that runs for a while (code in a sandbox) should accept a keyword ``timeout_s``:
    the environment gives it what is left of the turn's time budget, and the tool uses the
    smaller of that and its own limit. Other tools are called as they are.
    """
    if timeout_s is not None and _takes_timeout(type(tool)):
        return tool.call(arguments, timeout_s=timeout_s)  # type: ignore[call-arg]
    return tool.call(arguments)


class FunctionTool:
    """A plain Python function exposed as a tool: ``fn(**arguments) -> str``."""

    def __init__(
        self,
        fn: Callable[..., str],
        name: str,
        description: str,
        parameters: Mapping[str, Any],
    ) -> None:
        self._fn = fn
        self._spec = ToolSpec(name=name, description=description, parameters=dict(parameters))

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    def call(self, arguments: Mapping[str, Any]) -> str:
        return str(self._fn(**arguments))


def validate_arguments(spec: ToolSpec, arguments: Any) -> str | None:
    """Check ``arguments`` against the tool's JSON schema; the problems as one line, or None."""
    validator = jsonschema.Draft202012Validator(dict(spec.parameters))
    problems = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path)):
        if error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else error.message
            problems.append(f"missing required argument {missing!r}")
        elif error.validator == "additionalProperties":
            problems.append(error.message.replace("Additional properties", "unknown argument(s)"))
        elif error.path:
            problems.append(f"argument {error.path[0]!r}: {error.message}")
        else:
            problems.append(error.message)
    return "; ".join(problems) or None
