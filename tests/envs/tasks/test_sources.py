"""Task sources: seeded and regenerable by id, real data from installed packages, clear errors
on bad user files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from areal_agents.envs.tasks import (
    CODE_TEMPLATES,
    ListTaskSource,
    ProceduralCodeTasks,
    ReasoningGymTasks,
    code_tasks_from_jsonl,
    humaneval_tasks,
    math_tasks_from_jsonl,
    qa_tasks_from_jsonl,
    read_corpus,
    read_jsonl,
)
from areal_agents.errors import ConfigError
from areal_agents.rewards import UnitTestReward, UnitTests
from areal_agents.sandboxes import make_sandbox


def test_humaneval_ships_164_problems_with_tests() -> None:
    source = humaneval_tasks()
    assert (
        len(source) == 164 and source.ids[0] == "HumanEval/0" and source.ids[-1] == "HumanEval/163"
    )
    task = source.get("HumanEval/32")
    assert task.metadata["entry_point"] == "find_zero"
    assert "def check(candidate)" in task.metadata["tests"]
    assert "canonical_solution" not in task.prompt and "def find_zero" in task.prompt


def test_procedural_tasks_are_seeded_and_regenerate_from_their_id() -> None:
    source = ProceduralCodeTasks(difficulty="all")
    a = [source.sample(np.random.default_rng(0)) for _ in range(3)]
    b = [source.sample(np.random.default_rng(0)) for _ in range(3)]
    assert a == b
    drawn = {source.sample(np.random.default_rng(s)).id for s in range(600)}
    assert len({i.split("/")[1] for i in drawn}) == len(CODE_TEMPLATES)  # every template comes up
    assert all(source.get(i).metadata["entry_point"].isidentifier() for i in drawn)
    for task in a:
        assert source.get(task.id) == task
    with pytest.raises(ConfigError, match="gen/<template>/<seed>"):
        source.get("HumanEval/0")


def test_difficulty_chooses_the_templates_drawn_and_any_id_can_be_looked_up() -> None:
    level = {t.key: t.level for t in CODE_TEMPLATES}
    for difficulty, expected in ((None, {"medium"}), ("easy", {"easy"}), ("all", None)):
        source = ProceduralCodeTasks(difficulty=difficulty)
        drawn = {source.sample(np.random.default_rng(s)).id.split("/")[1] for s in range(300)}
        levels = {level[k] for k in drawn}
        assert levels == (expected or {"easy", "medium"}), difficulty
    medium = ProceduralCodeTasks()
    assert medium.difficulty == "medium"
    assert medium.get("gen/add/7") == ProceduralCodeTasks(["add"]).make("add", 7)  # any id
    assert ProceduralCodeTasks(["add", "gcd"]).difficulty == "all"  # named: no level filter
    with pytest.raises(ConfigError, match="'add' is easy, not medium"):
        ProceduralCodeTasks(["add"], difficulty="medium")
    with pytest.raises(ConfigError, match="did you mean 'medium'"):
        ProceduralCodeTasks(difficulty="meduim")
    with pytest.raises(ConfigError, match="unknown code difficulty 5"):  # a number: no TypeError
        ProceduralCodeTasks(difficulty=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no code template 'nope'"):
        medium.get("gen/nope/1")


def test_every_template_has_a_correct_solution_and_tests_that_catch_a_wrong_one() -> None:
    source = ProceduralCodeTasks(num_tests=4)
    reward = UnitTestReward(mode="fraction")
    with make_sandbox("process") as sandbox:
        for template in CODE_TEMPLATES:
            for seed in (1, 2):
                task = source.make(template.key, seed)
                tests = UnitTests.from_mapping(task.metadata)
                assert len(tests.tests) == 4
                good = reward.check(task.metadata["canonical_solution"], tests, sandbox)
                assert good.status == "correct", (task.id, good)
                wrong = f"def {tests.entry_point}(*args):\n    return None"
                assert reward.check(wrong, tests, sandbox).reward < 1.0, task.id
                assert task.metadata["entry_point"] in task.prompt and "Example" in task.prompt


def test_reasoning_gym_tasks_regenerate_and_reject_unknown_datasets() -> None:
    source = ReasoningGymTasks(["gsm_symbolic", "chain_sum"])
    task = source.sample(np.random.default_rng(1))
    assert source.get(task.id) == task and task.answer
    assert "\\boxed{}" in task.prompt
    json.dumps(task.metadata["entry"])  # kept JSON-able
    with pytest.raises(ConfigError, match="did you mean 'chain_sum'"):
        ReasoningGymTasks(["chain_sun"])
    with pytest.raises(ConfigError, match="not enabled"):
        source.get("rg/basic_arithmetic/1")
    easy = ReasoningGymTasks(["basic_arithmetic"], config={"basic_arithmetic": {"max_terms": 2}})
    expression = easy.sample(np.random.default_rng(0)).metadata["entry"]["metadata"]["expression"]
    assert len([t for t in expression.split() if t.lstrip("-").isdigit()]) <= 2


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_loaders(tmp_path: Path) -> None:
    code = code_tasks_from_jsonl(
        _jsonl(tmp_path / "c.jsonl", [{"prompt": "p", "tests": ["assert f()"], "entry_point": "f"}])
    )
    assert code.get("c/0").metadata["entry_point"] == "f"
    math = math_tasks_from_jsonl(_jsonl(tmp_path / "m.jsonl", [{"question": "1+1?", "answer": 2}]))
    assert math.get("m/0").answer == 2
    qa = qa_tasks_from_jsonl(
        _jsonl(tmp_path / "q.jsonl", [{"question": "q", "golden_answers": ["a", "b"]}])
    )
    assert qa.get("q/0").answer == ("a", "b")
    docs = read_corpus(_jsonl(tmp_path / "d.jsonl", [{"contents": '"T"\nbody'}, {"text": "x"}]))
    assert (docs[0].title, docs[0].text, docs[1].id) == ("T", "body", "1")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "holds no rows"),
        ("{not json}\n", "not valid JSON"),
        ("[1, 2]\n", "JSON object"),
        ('{"prompt": "p"}\n', "missing key"),
        ('{"prompt": "p", "tests": [1]}\n', "list of strings"),
    ],
)
def test_bad_user_files_say_what_is_wrong(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        code_tasks_from_jsonl(path)


def test_missing_file_and_duplicate_ids(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_jsonl(tmp_path / "nope.jsonl")
    path = _jsonl(tmp_path / "dup.jsonl", [{"id": "a", "question": "q", "answer": 1}] * 2)
    with pytest.raises(ConfigError, match="duplicate"):
        math_tasks_from_jsonl(path)
    with pytest.raises(ConfigError, match="no tasks"):
        ListTaskSource([])
