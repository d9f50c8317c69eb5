"""Task sources for the built-in environments: benchmarks that ship in packages, seeded
generators, and loaders for user JSONL files."""

from areal_agents.envs.tasks.base import ListTaskSource, TaskSource, read_jsonl
from areal_agents.envs.tasks.code import (
    CODE_TEMPLATES,
    CodeTemplate,
    ProceduralCodeTasks,
    code_tasks_from_jsonl,
    humaneval_path,
    humaneval_tasks,
)
from areal_agents.envs.tasks.knowledge import (
    QUESTION_TYPES,
    SyntheticKnowledgeBase,
    qa_tasks_from_jsonl,
    read_corpus,
)
from areal_agents.envs.tasks.math import (
    DEFAULT_MATH_DATASETS,
    NUMERIC_DATASETS,
    ReasoningGymTasks,
    math_tasks_from_jsonl,
)

__all__ = [
    "CODE_TEMPLATES",
    "DEFAULT_MATH_DATASETS",
    "NUMERIC_DATASETS",
    "QUESTION_TYPES",
    "CodeTemplate",
    "ListTaskSource",
    "ProceduralCodeTasks",
    "ReasoningGymTasks",
    "SyntheticKnowledgeBase",
    "TaskSource",
    "code_tasks_from_jsonl",
    "humaneval_path",
    "humaneval_tasks",
    "math_tasks_from_jsonl",
    "qa_tasks_from_jsonl",
    "read_corpus",
    "read_jsonl",
]
