"""Tools the model can call: the contract, parsing of calls from text, and built-in tools."""

from areal_agents.tools.base import FunctionTool, Tool, validate_arguments
from areal_agents.tools.parsing import ParseProblem, parse_tool_calls, strip_tool_calls

__all__ = [
    "FunctionTool",
    "ParseProblem",
    "Tool",
    "parse_tool_calls",
    "strip_tool_calls",
    "validate_arguments",
]
