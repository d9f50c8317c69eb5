"""Question answering that needs search: a synthetic knowledge base, user corpora and QA files.

:class:`SyntheticKnowledgeBase` invents a small world from a seed — countries, cities, people and
companies with made-up names — writes one encyclopedia-style document per entity, and asks
multi-hop questions about it ("In which country was the founder of Vorquel Dynamics born?").
No model has seen these names, so the answers cannot come from memory: they have to be found by
searching the documents, one hop at a time.

>>> kb = SyntheticKnowledgeBase(seed=0)
>>> task = kb.sample(np.random.default_rng(0))
>>> kb.get(task.id) == task, task.metadata["hops"] >= 2
(True, True)
>>> task.answer in task.prompt
False
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from areal_agents.envs.base import Task
from areal_agents.envs.tasks.base import ListTaskSource, read_jsonl
from areal_agents.errors import ConfigError
from areal_agents.tools.search_tool import Document

__all__ = [
    "QUESTION_TYPES",
    "SyntheticKnowledgeBase",
    "qa_tasks_from_jsonl",
    "read_corpus",
]

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "kr", "st", "th", "tr", "sh")  # fmt: skip
_NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "y")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "x", "m")
_COUNTRY_SUFFIX = ("ia", "land", "ara", "mark", "istan", "ovia")
_COMPANY_SUFFIX = ("Industries", "Dynamics", "Works", "Labs", "Holdings", "Systems", "Foundry")
_CURRENCY_UNIT = ("crown", "florin", "mark", "dinar", "talen", "shell")
_OCCUPATIONS = ("engineer", "chemist", "architect", "economist", "painter", "geologist",
                "surgeon", "composer", "botanist", "lawyer")  # fmt: skip
_INDUSTRIES = ("shipbuilding", "textile", "software", "mining", "brewing", "aerospace",
               "pharmaceutical", "glassmaking")  # fmt: skip

#: question type -> (template, hops). ``{x}`` is the entity the question starts from.
QUESTION_TYPES: dict[str, tuple[str, int]] = {
    "birthplace": ("In which city was {x} born?", 1),
    "founder_birthplace": ("In which city was the founder of {x} born?", 2),
    "employer_hq": ("In which city is the company that {x} works at headquartered?", 2),
    "employer_founder": ("Who founded the company that {x} works at?", 2),
    "employer_year": ("In what year was the company that {x} works at founded?", 2),
    "city_capital": ("What is the capital of the country that the city of {x} is in?", 2),
    "founder_country": ("In which country was the founder of {x} born?", 3),
    "hq_capital": ("What is the capital of the country where {x} is headquartered?", 3),
    "birth_currency": ("What is the currency of the country where {x} was born?", 3),
}


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


@dataclass
class _Entity:
    kind: str
    key: str
    name: str
    facts: dict[str, Any]


class SyntheticKnowledgeBase:
    """A seeded invented world: its documents (the search corpus) and questions about it.

    Args:
        seed: the world's seed (the same seed always gives the same world and questions).
        num_countries, num_cities, num_people, num_companies: the world's size.
        min_hops, max_hops: which questions to ask (1 = single look-up, up to 3 hops).
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        num_countries: int = 6,
        num_cities: int = 24,
        num_people: int = 48,
        num_companies: int = 24,
        min_hops: int = 2,
        max_hops: int = 3,
    ) -> None:
        if not 1 <= min_hops <= max_hops <= 3:
            raise ConfigError(f"hops {min_hops}..{max_hops}: need 1 <= min_hops <= max_hops <= 3")
        if num_cities < num_countries or num_people < num_companies or num_countries < 2:
            raise ConfigError(
                "the world needs >= 2 countries, at least as many cities as countries and "
                "at least as many people as companies"
            )
        self.seed = seed
        self.min_hops, self.max_hops = min_hops, max_hops
        rng = random.Random(f"areal-kb/{seed}")
        self._used: set[str] = set()
        self.countries = [self._country(rng, i) for i in range(num_countries)]
        self.cities = [self._city(rng, i) for i in range(num_cities)]
        for country in self.countries:  # every country's first city is its capital
            mine = [c for c in self.cities if c.facts["country"] is country]
            country.facts["capital"] = mine[0]
            country.facts["cities"] = mine
        self.people = [self._person(rng, i) for i in range(num_people)]
        founders = rng.sample(self.people, num_companies)
        self.companies = [self._company(rng, i, founders[i]) for i in range(num_companies)]
        for person in self.people:
            own = [c for c in self.companies if c.facts["founder"] is person]
            person.facts["employer"] = own[0] if own else rng.choice(self.companies)
        self.documents: list[Document] = [
            self._document(e)
            for e in (*self.countries, *self.cities, *self.people, *self.companies)
        ]
        self.questions = ListTaskSource(self._questions(), name=f"synthetic knowledge base {seed}")

    # ---- TaskSource ----------------------------------------------------------------------

    def sample(self, rng: np.random.Generator) -> Task:
        return self.questions.sample(rng)

    def get(self, task_id: str) -> Task:
        return self.questions.get(task_id)

    def __len__(self) -> int:
        return len(self.questions)

    # ---- the world -----------------------------------------------------------------------

    def _name(self, rng: random.Random, syllables: tuple[int, int] = (2, 2)) -> str:
        for _ in range(1000):
            n = rng.randint(*syllables)
            word = "".join(
                rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(n)
            )
            word = word.capitalize()
            if word.lower() not in self._used and 4 <= len(word) <= 10:
                self._used.add(word.lower())
                return word
        raise RuntimeError("ran out of invented names")  # pragma: no cover

    def _country(self, rng: random.Random, i: int) -> _Entity:
        name = self._name(rng, (1, 2)) + rng.choice(_COUNTRY_SUFFIX)
        currency = f"{self._name(rng, (2, 2))} {rng.choice(_CURRENCY_UNIT)}"
        self._used.add(name.lower())
        return _Entity("country", f"country-{i}", name, {"currency": currency})

    def _city(self, rng: random.Random, i: int) -> _Entity:
        country = self.countries[i] if i < len(self.countries) else rng.choice(self.countries)
        facts = {"country": country, "founded": rng.randint(900, 1890)}
        return _Entity("city", f"city-{i}", self._name(rng), facts)

    def _person(self, rng: random.Random, i: int) -> _Entity:
        name = f"{self._name(rng, (2, 2))} {self._name(rng, (2, 3))}"
        facts = {
            "born_in": rng.choice(self.cities),
            "born": rng.randint(1930, 1975),
            "occupation": rng.choice(_OCCUPATIONS),
        }
        return _Entity("person", f"person-{i}", name, facts)

    def _company(self, rng: random.Random, i: int, founder: _Entity) -> _Entity:
        name = f"{self._name(rng, (2, 3))} {rng.choice(_COMPANY_SUFFIX)}"
        facts = {
            "founder": founder,
            "headquarters": rng.choice(self.cities),
            "founded": founder.facts["born"] + rng.randint(24, 45),
            "industry": rng.choice(_INDUSTRIES),
        }
        return _Entity("company", f"company-{i}", name, facts)

    def _document(self, e: _Entity) -> Document:
        f = e.facts
        if e.kind == "country":
            others = ", ".join(c.name for c in f["cities"][1:4])
            text = (
                f"{e.name} is a country. Its capital is {f['capital'].name}. "
                f"The currency of {e.name} is the {f['currency']}."
            )
            if others:
                text += f" Other cities in {e.name} include {others}."
        elif e.kind == "city":
            text = f"{e.name} is a city in {f['country'].name}. It was founded in {f['founded']}."
            if f["country"].facts["capital"] is e:
                text += f" It is the capital of {f['country'].name}."
        elif e.kind == "person":
            text = (
                f"{e.name} is {_a(f['occupation'])} who was born in {f['born_in'].name} in "
                f"{f['born']}. {e.name} works at {f['employer'].name}."
            )
        else:
            text = (
                f"{e.name} is {_a(f['industry'])} company founded in {f['founded']} by "
                f"{f['founder'].name}. Its headquarters are in {f['headquarters'].name}."
            )
        return Document(id=e.key, title=e.name, text=text)

    def _chain(self, qtype: str, x: _Entity) -> list[_Entity | str] | None:
        """The entities from ``x`` to the answer (the last item), or None if the question
        does not apply to ``x`` or would give its answer away."""
        f = x.facts
        if qtype == "birthplace" and x.kind == "person":
            return [x, f["born_in"]]
        if qtype == "founder_birthplace" and x.kind == "company":
            return [x, f["founder"], f["founder"].facts["born_in"]]
        if qtype == "founder_country" and x.kind == "company":
            city = f["founder"].facts["born_in"]
            return [x, f["founder"], city, city.facts["country"]]
        if x.kind == "person" and qtype.startswith("employer_"):
            company = f["employer"]
            if company.facts["founder"] is x:
                return None  # "who founded the company that X works at" would be X
            last = {
                "employer_hq": company.facts["headquarters"],
                "employer_founder": company.facts["founder"],
                "employer_year": str(company.facts["founded"]),
            }[qtype]
            return [x, company, last]
        if qtype == "city_capital" and x.kind == "city":
            country = f["country"]
            if country.facts["capital"] is x:
                return None
            return [x, country, country.facts["capital"]]
        if qtype == "hq_capital" and x.kind == "company":
            city = f["headquarters"]
            country = city.facts["country"]
            if country.facts["capital"] is city:
                return None
            return [x, city, country, country.facts["capital"]]
        if qtype == "birth_currency" and x.kind == "person":
            country = f["born_in"].facts["country"]
            return [x, f["born_in"], country, country.facts["currency"]]
        return None

    def _questions(self) -> list[Task]:
        tasks = []
        for qtype, (template, hops) in QUESTION_TYPES.items():
            if not self.min_hops <= hops <= self.max_hops:
                continue
            for x in (*self.people, *self.companies, *self.cities):
                chain = self._chain(qtype, x)
                if chain is None:
                    continue
                last = chain[-1]
                answer = last if isinstance(last, str) else last.name
                tasks.append(
                    Task(
                        id=f"kb{self.seed}/{qtype}/{x.key}",
                        prompt=template.format(x=x.name),
                        answer=answer,
                        metadata={
                            "source": "synthetic_kb",
                            "kb_seed": self.seed,
                            "hops": hops,
                            "question_type": qtype,
                            "path": [c if isinstance(c, str) else c.name for c in chain],
                        },
                    )
                )
        return tasks


# ---- user data ---------------------------------------------------------------------------


def read_corpus(path: str | Path) -> list[Document]:
    """Documents from a JSONL corpus: ``contents`` (Search-R1 style, ``"Title"\\ntext``) or
    ``text`` with an optional ``title``; ``id`` optional (the line number otherwise)."""
    docs = []
    for n, row in enumerate(read_jsonl(path)):
        doc_id = str(row.get("id", row.get("_id", n)))
        if "contents" in row:
            docs.append(Document.from_contents(doc_id, str(row["contents"])))
        elif "text" in row:
            docs.append(Document(id=doc_id, title=str(row.get("title", "")), text=str(row["text"])))
        else:
            raise ConfigError(f"{path}: row {n} needs 'contents' or 'text' (found {sorted(row)})")
    return docs


def qa_tasks_from_jsonl(path: str | Path) -> ListTaskSource:
    """QA tasks from JSONL: ``question`` and ``answer`` (a string) or ``answers`` /
    ``golden_answers`` (a list of acceptable strings)."""
    tasks = []
    for n, row in enumerate(read_jsonl(path, required=("question",))):
        answers: Sequence[str] | str | None = None
        for key in ("golden_answers", "answers", "answer"):
            if key in row:
                answers = row[key]
                break
        if answers is None:
            raise ConfigError(f"{path}: row {n} needs 'answer', 'answers' or 'golden_answers'")
        answer: Any = tuple(str(a) for a in answers) if isinstance(answers, list) else str(answers)
        task_id = str(row.get("id", row.get("task_id", f"{Path(path).stem}/{n}")))
        tasks.append(
            Task(
                id=task_id,
                prompt=str(row["question"]),
                answer=answer,
                metadata={"source": str(path)},
            )
        )
    return ListTaskSource(tasks, name=str(path))
