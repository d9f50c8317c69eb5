"""Tools the model can call: the contract, parsing of calls from text, and built-in tools."""

from areal_agents.tools.base import FunctionTool, Tool, validate_arguments
from areal_agents.tools.parsing import ParseProblem, parse_tool_calls, strip_tool_calls
from areal_agents.tools.python_tool import BashTool, EpisodeSandbox, PythonTool, format_exec_result
from areal_agents.tools.search_tool import (
    BM25Retriever,
    Document,
    HttpRetriever,
    RetrievalServer,
    Retriever,
    RetrieverError,
    SearchTool,
    default_cache_dir,
)

__all__ = [
    "BM25Retriever",
    "BashTool",
    "Document",
    "EpisodeSandbox",
    "FunctionTool",
    "HttpRetriever",
    "ParseProblem",
    "PythonTool",
    "RetrievalServer",
    "Retriever",
    "RetrieverError",
    "SearchTool",
    "Tool",
    "default_cache_dir",
    "format_exec_result",
    "parse_tool_calls",
    "strip_tool_calls",
    "validate_arguments",
]
