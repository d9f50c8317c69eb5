"""``areal_agents/Search-v0``: answer questions by searching a document collection.

The model calls ``search(query)`` and reads the top passages, as many times as it needs, then
answers with ``<answer>...</answer>`` (``\\boxed{}`` also works). Reward: exact match after
normalisation (``metric="f1"`` for token F1).

Task sources:

* ``source="synthetic"`` (default): an invented world of countries, cities, people and companies
  (:class:`~areal_agents.envs.tasks.SyntheticKnowledgeBase`) with multi-hop questions whose
  answers exist only in its documents. ``kb_seed=None`` draws a new world for every episode (so
  a policy cannot memorise one; its small index is built in memory), an integer fixes one world
  (its index is cached on disk).
* ``source="jsonl"``: ``qa_path=`` questions (``question`` + ``answer``/``golden_answers``) over
  ``corpus_path=`` documents (``contents`` or ``title``/``text`` rows), indexed once with BM25
  and cached on disk; or over a Search-R1-style retrieval server (``retriever_url=``).

>>> env = SearchEnv(kb_seed=0)
>>> obs, info = env.reset(seed=1)
>>> [t["function"]["name"] for t in info["tools"]]
['search']
>>> env.step("<answer>I cannot know</answer>")[1]
0.0
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from areal_agents.envs._checks import check_choice, check_int, check_kwargs, parameter_names
from areal_agents.envs.base import MultiTurnEnv, Score, Task
from areal_agents.envs.tasks.base import TaskSource
from areal_agents.envs.tasks.knowledge import (
    SyntheticKnowledgeBase,
    qa_tasks_from_jsonl,
    read_corpus,
)
from areal_agents.errors import ConfigError, did_you_mean
from areal_agents.rewards.text import F1, ExactMatch
from areal_agents.tools.base import Tool
from areal_agents.tools.search_tool import (
    BM25Retriever,
    Document,
    HttpRetriever,
    Retriever,
    SearchTool,
)
from areal_agents.types import Turn

__all__ = ["SEARCH_SOURCES", "SearchEnv"]

SEARCH_SOURCES = ("synthetic", "jsonl")
_KB_ID = re.compile(r"^kb(\d+)/")
_WORLDS_KEPT = 8  # synthetic worlds (and their indexes) kept per environment


class _Unbound:
    """The retriever of the tool set built before any task exists (never searched)."""

    def search(self, queries: Sequence[str], topk: int) -> list[list[Document]]:
        raise RuntimeError("no task yet: call reset() first")


def _check_kb_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The synthetic world's options, checked by building a small world with them now."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"kb_options={options!r}: must be a dict of SyntheticKnowledgeBase options"
        )
    out = dict(options)
    known = [n for n in parameter_names(SyntheticKnowledgeBase.__init__) if n != "seed"]
    check_kwargs("kb_options", {k: v for k, v in out.items() if k not in known}, known)
    for key, value in out.items():
        check_int(f"kb_options[{key!r}]", value, minimum=0)
    SyntheticKnowledgeBase(0, **out)  # its own checks (hops, sizes) fail here, at construction
    return out


class SearchEnv(MultiTurnEnv):
    """Question answering with a ``search`` tool.

    Args:
        source: ``"synthetic"``, ``"jsonl"`` or a TaskSource (then give ``corpus_path`` or
            ``retriever_url`` too).
        kb_seed: the synthetic world (None: a new world per episode).
        kb_options: :class:`~areal_agents.envs.tasks.SyntheticKnowledgeBase` options
            (``num_people``, ``min_hops``, ``max_hops`` ...).
        qa_path, corpus_path: the JSONL files for ``source="jsonl"``.
        retriever_url: a Search-R1-style retrieval server to use instead of the local index.
        topk: passages per search.
        index_dir: where BM25 indexes are cached (default ``$AREAL_CACHE_DIR/search`` or
            ``~/.cache/areal_agents/search``).
        metric: ``"em"`` (exact match) or ``"f1"``.
        **kwargs: :class:`~areal_agents.envs.base.MultiTurnEnv` options (``max_turns`` ...).
    """

    default_system_prompt: ClassVar[str | None] = (
        "Answer the question. You know nothing about the entities it mentions: use the search "
        "tool to look them up, and search again for the names you find until you reach the "
        "answer. Then reply with the answer alone as <answer>...</answer>."
    )

    def __init__(
        self,
        *,
        source: str | TaskSource = "synthetic",
        kb_seed: int | None = None,
        kb_options: Mapping[str, Any] | None = None,
        qa_path: str | None = None,
        corpus_path: str | None = None,
        retriever_url: str | None = None,
        topk: int = 3,
        index_dir: str | None = None,
        metric: str = "em",
        max_turns: int = 8,
        **kwargs: Any,
    ) -> None:
        check_choice("metric", metric, ("em", "f1"))
        self.topk = check_int("topk", topk, minimum=1)
        if kb_seed is not None:
            check_int("kb_seed", kb_seed, minimum=0)
        self.kb_seed = kb_seed
        self.kb_options = _check_kb_options(kb_options)
        self._cache_dir: str | Path = index_dir or "default"
        self.reward = (
            ExactMatch(fallback_to_text=False) if metric == "em" else F1(fallback_to_text=False)
        )
        self._retriever: Retriever | None = None
        self._worlds: OrderedDict[int, tuple[SyntheticKnowledgeBase, BM25Retriever | None]] = (
            OrderedDict()
        )
        if retriever_url is not None:
            self._retriever = HttpRetriever(retriever_url)
        if isinstance(source, str) and source == "synthetic":
            if retriever_url is not None and kb_seed is None:
                raise ConfigError(
                    "retriever_url with the synthetic source needs a fixed kb_seed (the server "
                    "must index that world's documents; see SyntheticKnowledgeBase(seed))"
                )
            self.source: TaskSource | None = None
            if kb_seed is not None:
                self._world(kb_seed)  # fail fast on bad options
        elif isinstance(source, str) and source == "jsonl":
            if qa_path is None:
                raise ConfigError("source='jsonl' needs qa_path=<questions.jsonl>")
            self.source = qa_tasks_from_jsonl(qa_path)
        elif isinstance(source, str):
            raise ConfigError(
                f"unknown search task source {source!r}{did_you_mean(source, SEARCH_SOURCES)}; "
                "choose 'synthetic' or 'jsonl', or pass a TaskSource"
            )
        else:
            self.source = source
        if self.source is not None and self._retriever is None:
            if corpus_path is None:
                raise ConfigError("a non-synthetic source needs corpus_path= or retriever_url=")
            self._retriever = BM25Retriever(read_corpus(corpus_path), cache_dir=self._cache_dir)
        super().__init__(max_turns=max_turns, **kwargs)

    def _world(self, seed: int) -> SyntheticKnowledgeBase:
        world = self._worlds.pop(seed, None)
        if world is None:
            world = (SyntheticKnowledgeBase(seed, **self.kb_options), None)
        self._worlds[seed] = world  # most recently used last
        while len(self._worlds) > _WORLDS_KEPT:
            self._worlds.popitem(last=False)
        return world[0]

    def _world_retriever(self, seed: int) -> BM25Retriever:
        kb = self._world(seed)
        retriever = self._worlds[seed][1]
        if retriever is None:
            cache: str | Path | None = self._cache_dir if seed == self.kb_seed else None
            retriever = BM25Retriever(kb.documents, cache_dir=cache)
            self._worlds[seed] = (kb, retriever)
        return retriever

    def sample_task(self, rng: np.random.Generator) -> Task:
        if self.source is not None:
            return self.source.sample(rng)
        seed = self.kb_seed if self.kb_seed is not None else int(rng.integers(0, 2**31 - 1))
        return self._world(seed).sample(rng)

    def get_task(self, task_id: str) -> Task:
        if self.source is not None:
            return self.source.get(task_id)
        match = _KB_ID.match(task_id)
        if match is None:
            raise ConfigError(f"task id {task_id!r} is not a synthetic one (kb<seed>/...)")
        return self._world(int(match.group(1))).get(task_id)

    def make_tools(self, task: Task | None) -> Sequence[Tool]:
        return (SearchTool(self._retriever_for(task), topk=self.topk),)

    def _retriever_for(self, task: Task | None) -> Retriever:
        if self._retriever is not None:
            return self._retriever
        if task is None:
            return _Unbound()
        seed = task.metadata.get("kb_seed", self.kb_seed)
        if seed is None:
            raise ConfigError(
                f"task {task.id!r} names no synthetic world (metadata['kb_seed']); give the "
                "environment a corpus_path or retriever_url for outside questions"
            )
        return self._world_retriever(int(seed))

    def demonstration(self, task: Task) -> list[dict[str, Any]] | None:
        """A synthetic question solved as the system prompt asks: one search per entity on its
        chain (each name is in the previous search's result), then ``<answer>...</answer>``;
        None for outside questions (no chain) and chains longer than ``max_turns`` allows."""
        path = task.metadata.get("path")
        if task.metadata.get("source") != "synthetic_kb" or not path or task.answer is None:
            return None
        names = [str(name) for name in path[:-1]]
        if len(names) + 1 > self.max_turns:
            return None
        turns: list[dict[str, Any]] = [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "search", "arguments": json.dumps({"query": name})},
                    }
                ],
            }
            for i, name in enumerate(names)
        ]
        return [*turns, {"role": "assistant", "content": f"<answer>{task.answer}</answer>"}]

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        if task.answer is None:
            raise ConfigError(f"task {task.id!r} has no answer")
        result = self.reward(submission, task.answer)
        return Score(result.reward, result.to_details())

    def close(self) -> None:
        if isinstance(self._retriever, HttpRetriever):
            self._retriever.close()
        super().close()
