"""Search-v0: multi-hop questions over an invented world are unanswerable without the search
tool and answerable with it; user corpora, the HTTP retriever, and the model's mistakes."""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from areal_agents.envs import SearchEnv, make_env
from areal_agents.envs.tasks import QUESTION_TYPES, SyntheticKnowledgeBase
from areal_agents.errors import ConfigError
from areal_agents.policies import ScriptedPolicy
from areal_agents.rollout import run_episode
from areal_agents.tools import BM25Retriever, RetrievalServer
from areal_agents.types import Message, ToolSpec


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# What a reader of the documents does: one regular expression per relation.
RELATIONS = {
    "founder": r"founded in \d+ by (?P<v>[^.]+)\.",
    "company_year": r"company founded in (?P<v>\d+) by",
    "headquarters": r"Its headquarters are in (?P<v>[^.]+)\.",
    "born_in": r"was born in (?P<v>.+?) in \d+\.",
    "employer": r"works at (?P<v>[^.]+ \w+)\.",
    "country": r"is a city in (?P<v>[^.]+)\.",
    "capital": r"Its capital is (?P<v>[^.]+)\.",
    "currency": r"The currency of [^.]+ is the (?P<v>[^.]+)\.",
}
PLANS = {
    "birthplace": ["born_in"],
    "founder_birthplace": ["founder", "born_in"],
    "employer_hq": ["employer", "headquarters"],
    "employer_founder": ["employer", "founder"],
    "employer_year": ["employer", "company_year"],
    "city_capital": ["country", "capital"],
    "founder_country": ["founder", "born_in", "country"],
    "hq_capital": ["headquarters", "country", "capital"],
    "birth_currency": ["born_in", "country", "currency"],
}


def parse_question(question: str) -> tuple[str, str]:
    found = []
    for qtype, (template, _) in QUESTION_TYPES.items():
        pattern = re.escape(template).replace(re.escape("{x}"), "(?P<x>.+)")
        match = re.fullmatch(pattern, question)
        if match:
            found.append((len(match.group("x")), qtype, match.group("x")))
    assert found, f"unknown question {question!r}"
    _, qtype, entity = min(found)  # the most specific template leaves the shortest name
    return qtype, entity


def searcher(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    """Follow the chain: search the entity, read its own passage, extract the next name."""
    question = next(m.content for m in conversation if m.role == "user")
    qtype, entity = parse_question(question)
    steps = PLANS[qtype]
    results = [m.content for m in conversation if m.role == "tool"]
    for i, relation in enumerate(steps):
        if i == len(results):
            return f"I need to look up {entity}. " + call("search", query=entity)
        passages = results[i].split("\n\n")
        own = next((p for p in passages if p.split("\n", 1)[0].endswith(f"] {entity}")), None)
        assert own is not None, f"no passage about {entity!r} in {results[i]!r}"
        match = re.search(RELATIONS[relation], own)
        assert match is not None, (relation, own)
        entity = match.group("v")
    return f"<answer>{entity}</answer>"


def guesser(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    """Answers at once with the most plausible name it can see: one from the question."""
    question = next(m.content for m in conversation if m.role == "user")
    return f"<answer>{parse_question(question)[1]}</answer>"


async def test_questions_are_answerable_with_the_search_tool() -> None:
    env = SearchEnv(topk=3)  # a new invented world every episode
    hops: Counter[int] = Counter()
    for seed in range(24):
        episode = await run_episode(env, ScriptedPolicy(searcher), seed=seed)
        assert episode.reward == 1.0, (episode.task_id, episode.messages[-1].content)
        hops[len(PLANS[episode.task_id.split("/")[1]])] += 1
        assert episode.tool_calls == len(PLANS[episode.task_id.split("/")[1]])
        assert sum(episode.tool_errors.values()) == 0
    assert hops[2] and hops[3]  # both 2- and 3-hop questions came up
    env.close()


async def test_questions_are_unanswerable_without_the_tool() -> None:
    env = SearchEnv()
    rewards = []
    for seed in range(24):
        episode = await run_episode(env, ScriptedPolicy(guesser), seed=seed)
        rewards.append(episode.reward)
        assert episode.tool_calls == 0
    assert sum(rewards) == 0.0
    env.close()


def test_memorising_one_world_does_not_answer_another() -> None:
    # Perfect memory of world 1 (every fact of it) against questions from world 2: the names
    # differ, so the best a memoriser can do is answer with world 1's most frequent answer.
    seen, asked = SyntheticKnowledgeBase(1), SyntheticKnowledgeBase(2)
    remembered = Counter(t.answer for t in seen.questions).most_common(1)[0][0]
    assert not any(t.answer == remembered for t in asked.questions)
    names_1 = {d.title for d in seen.documents}
    assert not names_1 & {d.title for d in asked.documents}
    for task in asked.questions:
        assert task.answer not in task.prompt


def test_world_is_seeded_and_ids_regenerate() -> None:
    a, b = SyntheticKnowledgeBase(5), SyntheticKnowledgeBase(5)
    assert a.documents == b.documents and a.questions.ids == b.questions.ids
    assert SyntheticKnowledgeBase(6).documents != a.documents
    env = SearchEnv()
    obs, info = env.reset(seed=9)
    assert env.reset(options={"task_id": info["task_id"]})[0] == obs
    assert env.reset(seed=9)[0] == obs
    env.close()
    kb = SyntheticKnowledgeBase(0, min_hops=1, max_hops=1)
    assert {t.metadata["hops"] for t in kb.questions} == {1}
    with pytest.raises(ConfigError):
        SyntheticKnowledgeBase(0, min_hops=3, max_hops=2)


def test_fixed_world_index_is_cached_on_disk(tmp_path: Path) -> None:
    env = SearchEnv(kb_seed=3, index_dir=str(tmp_path))
    env.reset(seed=0)
    env.step(call("search", query="capital"))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("bm25-")]
    env.close()


def test_bad_tool_calls_and_running_out_of_turns() -> None:
    env = SearchEnv(max_turns=3)
    env.reset(seed=1)
    obs = env.step(call("search", q="x"))[0]
    assert "missing required argument 'query'" in obs[0]["content"]
    obs = env.step(call("search", query="   "))[0]
    assert "query is empty" in obs[0]["content"]
    obs, reward, terminated, truncated, info = env.step(call("lookup", query="x"))
    assert "unknown tool 'lookup'" in obs[0]["content"]
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["tool_errors"] == {
        "parse": 0,
        "unknown_tool": 1,
        "invalid_arguments": 1,
        "tool_failure": 1,
        "timeout": 0,
        "too_many_calls": 0,
        "time_budget": 0,
    }
    env.reset(seed=1)
    info = env.step("The answer is probably Paris.")[4]
    assert info["reward_details"]["status"] == "no_answer"  # answers go in <answer> tags
    env.close()


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


CORPUS = [
    {"id": "1", "contents": '"Vessa Dam"\nThe Vessa Dam was completed in 1931 on the Orl river.'},
    {"id": "2", "title": "Orl", "text": "The Orl is a river that flows into Lake Tamm."},
    {"id": "3", "contents": '"Lake Tamm"\nLake Tamm lies in the Brask highlands.'},
]
QA = [
    {"id": "q1", "question": "Into which lake flows the river of the Vessa Dam?",
     "golden_answers": ["Lake Tamm", "Tamm"]},
    {"question": "When was the Vessa Dam completed?", "answer": "1931"},
]  # fmt: skip


def test_user_corpus_and_questions(tmp_path: Path) -> None:
    corpus = _write_jsonl(tmp_path / "corpus.jsonl", CORPUS)  # type: ignore[arg-type]
    qa = _write_jsonl(tmp_path / "qa.jsonl", QA)  # type: ignore[arg-type]
    options = {"source": "jsonl", "qa_path": qa, "corpus_path": corpus, "index_dir": str(tmp_path)}
    checked = gym.make("areal_agents/Search-v0", **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(checked.unwrapped)
    checked.close()
    env = SearchEnv(**options)  # type: ignore[arg-type]
    env.reset(options={"task_id": "q1"})
    obs = env.step(call("search", query="Vessa Dam river"))[0]
    assert obs[0]["content"].startswith("[1] Vessa Dam\n")
    assert env.step("<answer>tamm</answer>")[1] == 1.0
    env.reset(options={"task_id": "qa/1"})
    assert env.step("<answer>1931</answer>")[1] == 1.0
    env.close()
    env = SearchEnv(
        source="jsonl", qa_path=qa, corpus_path=corpus, metric="f1", index_dir=str(tmp_path)
    )
    env.reset(options={"task_id": "q1"})
    assert 0.0 < env.step("<answer>the Tamm highlands</answer>")[1] < 1.0
    env.close()


async def test_http_retriever_serves_a_fixed_world() -> None:
    kb = SyntheticKnowledgeBase(4)
    with RetrievalServer(BM25Retriever(kb.documents, cache_dir=None)) as server:
        env = SearchEnv(kb_seed=4, retriever_url=server.url)
        for seed in range(3):
            episode = await run_episode(env, ScriptedPolicy(searcher), seed=seed)
            assert episode.reward == 1.0
        env.close()


def test_bad_configuration() -> None:
    with pytest.raises(ConfigError, match="synthetic"):
        SearchEnv(source="synthetc")
    with pytest.raises(ConfigError, match="qa_path"):
        SearchEnv(source="jsonl")
    with pytest.raises(ConfigError, match="metric"):
        SearchEnv(metric="bleu")
    with pytest.raises(ConfigError, match="http"):
        SearchEnv(kb_seed=0, retriever_url="localhost:8000")
    with pytest.raises(ConfigError, match="kb_seed"):
        SearchEnv(retriever_url="http://127.0.0.1:1")


def test_alias_and_check_env_on_a_fixed_world() -> None:
    env = make_env("search", kb_seed=0)
    assert isinstance(env.unwrapped, SearchEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()
    assert np.isfinite(len(SyntheticKnowledgeBase(0)))


def test_the_trainer_preset_can_answer_every_question_it_asks() -> None:
    """``env=search``'s turn limit leaves room for the longest chain (one search per hop, then
    the answer): with 3 turns, the 3-hop held-out questions were unanswerable."""
    from areal_agents.trainers.config import EnvConfig

    preset = EnvConfig.from_name("search")
    env = make_env("search", **preset.make_kwargs())
    rng = np.random.default_rng(0)
    inner = env.unwrapped
    assert isinstance(inner, SearchEnv)
    tasks = [inner.sample_task(rng) for _ in range(64)]
    assert max(t.metadata["hops"] for t in tasks) == 3  # the longest chains are asked
    assert all(inner.demonstration(t) is not None for t in tasks)
    env.close()
