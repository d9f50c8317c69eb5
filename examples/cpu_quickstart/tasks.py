"""Which calculator tasks are used for what: warm-start demonstrations, RL, held-out evaluation.

Every calculator task is drawn by ``env.reset(seed=s)``; its id is the expression
(``calc-48*52+76``). The three uses take disjoint seeds, and the ids are checked too:

* **held-out evaluation**: seeds ``HELDOUT_SEED0 + i``;
* **warm-start demonstrations**: seeds ``WARM_SEED0 + i``, skipping any id that is held out;
* **RL**: the trainer's own task stream (``trainers.data.task_seed(trainer.seed, index)``);
  :func:`overlap_with_training` counts the held-out ids among the tasks a run trained on
  (``batch/task_indices`` in its ``metrics.jsonl``), so a report can show it is zero.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "HELDOUT_SEED0",
    "WARM_SEED0",
    "demonstration",
    "dialogue",
    "heldout_seeds",
    "overlap_with_training",
    "task_for_seed",
    "warm_start_seeds",
]

HELDOUT_SEED0 = 900_000_000
WARM_SEED0 = 500_000_000


@functools.cache
def _env() -> Any:
    from areal_agents.envs.registry import make_env

    return make_env("calculator")


def task_for_seed(seed: int) -> Any:
    """The calculator task that ``reset(seed=seed)`` draws."""
    env = _env()
    env.reset(seed=int(seed))
    return env.unwrapped.task


def heldout_seeds(n: int) -> list[int]:
    """Seeds of the first ``n`` held-out evaluation tasks."""
    return [HELDOUT_SEED0 + i for i in range(n)]


@functools.cache
def _heldout_ids(n: int) -> frozenset[str]:
    return frozenset(task_for_seed(s).id for s in heldout_seeds(n))


def warm_start_seeds(n: int, heldout: int = 1024) -> list[int]:
    """Seeds of ``n`` demonstration tasks, none with the id of one of ``heldout`` eval tasks."""
    banned = _heldout_ids(heldout)
    out: list[int] = []
    seed = WARM_SEED0
    while len(out) < n:
        if task_for_seed(seed).id not in banned:
            out.append(seed)
        seed += 1
    return out


def demonstration(seed: int, use_tool: bool = True) -> tuple[list[Any], list[Any]]:
    """A correct episode for task ``seed``: (messages, tool specs).

    system + user (as the environment renders them), then with ``use_tool`` an assistant turn
    that calls the calculator on the expression, the tool's result, and
    ``The answer is \\boxed{N}.``; without it, that final answer straight away (the correct
    number, which a 135M model cannot work out in its head: imitating it means guessing).
    """
    from areal_agents.types import Message, ToolCall, ToolSpec

    env = _env()
    _, info = env.reset(seed=int(seed))
    base = env.unwrapped
    task = base.task
    opening = list(base.messages)
    call = ToolCall(
        "calculator", json.dumps({"expression": task.metadata["expression"]}), id="call_1_0"
    )
    answer = str(task.answer)
    if not use_tool:
        direct = [*opening, Message.assistant(f"The answer is \\boxed{{{answer}}}.")]
        return direct, [ToolSpec.from_openai(t) for t in info["tools"]]
    messages = [
        *opening,
        Message.assistant("", tool_calls=[call]),
        Message.tool(answer, call.id, "calculator"),
        Message.assistant(f"The answer is \\boxed{{{answer}}}."),
    ]
    tools = [ToolSpec.from_openai(t) for t in info["tools"]]
    return messages, tools


def dialogue(seeds: list[int], use_tool: list[bool]) -> tuple[list[Any], list[Any]]:
    """One conversation that asks the questions of tasks ``seeds`` one after the other, each
    demonstrated as :func:`demonstration` does (``use_tool[i]`` for question ``i``): the
    shape of a ``benchmarks.workloads:LongTailCalculator-v0`` dialogue."""
    messages: list[Any] = []
    tools: list[Any] = []
    for seed, tool in zip(seeds, use_tool, strict=True):
        turn, tools = demonstration(seed, use_tool=tool)
        messages += turn if not messages else turn[1:]  # one system prompt, at the start
    return messages, tools


def overlap_with_training(metrics_path: str | Path, data_seed: int, heldout: int) -> dict[str, int]:
    """How many tasks a run trained on, and how many of them are held-out evaluation tasks."""
    from areal_agents.trainers.data import task_seed

    indices: set[int] = set()
    for line in Path(metrics_path).read_text().splitlines():
        if line.strip():
            indices.update(int(i) for i in json.loads(line).get("batch/task_indices", []))
    banned = _heldout_ids(heldout)
    trained_ids = {task_for_seed(task_seed(data_seed, i)).id for i in indices}
    return {"trained_tasks": len(trained_ids), "heldout_overlap": len(trained_ids & banned)}


def ids(seeds: Iterable[int]) -> list[str]:
    """Task ids of ``seeds`` (for reports)."""
    return [task_for_seed(s).id for s in seeds]
