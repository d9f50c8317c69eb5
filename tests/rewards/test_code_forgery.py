"""Unit-test grades cannot be forged (issue 12 item 1, review failure S1).

Every wrong solution of :mod:`tests.rewards._forgeries` scores 0 (and is not ``correct``) on
every backend, for a procedural task and for a HumanEval task, while the honest right answer
scores 1 and the honest wrong one 0. The wire form and the host's reading of the sandbox's
output are checked on their own below.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from areal_agents.envs.tasks.code import ProceduralCodeTasks, humaneval_tasks
from areal_agents.rewards import UnitTestReward, UnitTests
from areal_agents.rewards._judge import JudgeSpec, judge_round
from areal_agents.rewards._unit_tests import _read
from areal_agents.rewards._wire import MAX_DEPTH, Unsendable, decode, dumps, encode
from areal_agents.sandboxes import BaseSandbox, ExecResult, make_sandbox
from tests.rewards._forgeries import FORGERIES

BACKENDS = [
    pytest.param("process", id="process"),
    pytest.param("bubblewrap", marks=pytest.mark.bubblewrap, id="bubblewrap"),
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
]
LIMITS = {"memory_mb": 256, "pids": 32, "max_output_bytes": 16 * 1024}


def _task(task_id: str) -> tuple[UnitTests, str, str]:
    """The tests, the honest right solution and an honest wrong one."""
    if task_id.startswith("HumanEval/"):
        task = humaneval_tasks().get(task_id)
        wrong = "def greatest_common_divisor(a, b):\n    return a * b\n"
    else:
        task = ProceduralCodeTasks().get(task_id)
        wrong = "def add(a, b):\n    return a - b\n"
    tests = UnitTests.from_mapping(task.metadata)
    return tests, task.metadata["canonical_solution"], wrong


TASKS = ["gen/add/7", "HumanEval/13"]


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Iterator[BaseSandbox]:
    with make_sandbox(str(request.param), **LIMITS) as sb:  # type: ignore[arg-type]
        yield sb


REWARD = UnitTestReward(case_timeout_s=1.0, timeout_s=5.0)


@pytest.mark.parametrize("task_id", TASKS)
def test_honest_answers_score_one_and_zero(sandbox: BaseSandbox, task_id: str) -> None:
    tests, right, wrong = _task(task_id)
    good = REWARD.check(right, tests, sandbox=sandbox)
    assert (good.reward, good.status) == (1.0, "correct"), good
    bad = REWARD.check(wrong, tests, sandbox=sandbox)
    assert (bad.reward, bad.status) == (0.0, "wrong"), bad


@pytest.mark.parametrize("task_id", TASKS)
@pytest.mark.parametrize(("name", "source"), FORGERIES, ids=[name for name, _ in FORGERIES])
def test_forgeries_score_zero(sandbox: BaseSandbox, task_id: str, name: str, source: str) -> None:
    tests, _, _ = _task(task_id)
    code = source.replace("NAME", str(tests.entry_point))
    result = REWARD.check(code, tests, sandbox=sandbox)
    assert result.reward == 0.0 and result.status != "correct", (name, result)
    # and the sandbox is still fit for the next grade
    right = REWARD.check(_task(task_id)[1], tests, sandbox=sandbox)
    assert right.status == "correct", (name, right)


@pytest.mark.parametrize(
    ("task_id", "code"),
    [
        # the tests use the prompt's helpers: the judge's own copy, never the solution's
        ("HumanEval/32", "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n"),
        (
            "HumanEval/38",
            "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
        ),
    ],
)
def test_redefining_the_prompts_helpers_does_not_help(task_id: str, code: str) -> None:
    tests = UnitTests.from_mapping(humaneval_tasks().get(task_id).metadata)
    result = UnitTestReward(backend="process").check(code, tests)
    assert (result.reward, result.status) == (0.0, "wrong"), result


def test_solution_names_never_replace_builtins_or_the_preamble() -> None:
    tests = UnitTests(
        tests=("assert abs(area(2) - 12.566) < 0.01", "assert sorted(f()) == [1, 2]"),
        entry_point="area",
        preamble="def f():\n    return [2, 1]\n",
    )
    code = (
        "import math as cheat\ndef abs(x):\n    return 0\ndef sorted(x):\n    return [1, 2]\n"
        "def f():\n    return [1, 2]\ndef area(r):\n    return 0\n"
    )
    result = UnitTestReward(backend="process", mode="fraction").check(code, tests)
    # the abs() case fails (the builtin abs, not the solution's); sorted(f()) is the builtin's
    # and the preamble's business, so it checks nothing of the solution: no case (issue 28 M2)
    assert (result.reward, result.details["passed"], result.details["total"]) == (0.0, 0, 1)


def test_stop_iteration_cannot_end_the_tests_loops_early() -> None:
    tests = UnitTests(
        tests=(
            "for y in map(f, [1, 2, 3]):\n    assert y == 0\n",
            "assert list(iter(lambda: f(1), None)) == [0]",
        ),
        entry_point="f",
    )
    code = "def f(x):\n    raise StopIteration"
    result = UnitTestReward(backend="process", mode="fraction").check(code, tests)
    assert (result.reward, result.details["passed"]) == (0.0, 0), result


def test_a_plain_string_reference_is_the_test_program() -> None:
    reward = UnitTestReward(backend="process")
    code = "```python\ndef f(x):\n    return x + 1\n```"
    assert reward(code, "assert f(1) == 2\nassert f(5) == 6\n").status == "correct"
    assert reward(code, "assert f(1) == 3\n").status == "wrong"


def test_program_mode_reads_values_and_calls_several_functions() -> None:
    tests = UnitTests(tests="assert LIMIT == 3\nx = double(LIMIT)\nassert half(x) == LIMIT\n")
    code = "LIMIT = 3\ndef double(n):\n    return 2 * n\ndef half(n):\n    return n // 2\n"
    result = UnitTestReward(backend="process").check(code, tests)
    assert (result.status, result.details["total"]) == ("correct", 2)


def test_in_place_changes_to_arguments_reach_the_tests() -> None:
    tests = UnitTests(tests="xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\n")
    code = "def sort_in_place(xs):\n    xs.sort()\n"
    assert UnitTestReward(backend="process").check(code, tests).status == "correct"


def test_exceptions_the_tests_expect_are_raised_in_the_tests() -> None:
    tests = UnitTests(
        tests=(
            "try:\n    root(-1)\n    ok = False\nexcept ValueError:\n    ok = True\nassert ok",
            "assert root(9) == 3",
        ),
        entry_point="root",
    )
    code = "def root(n):\n    if n < 0:\n        raise ValueError\n    return int(n ** .5)"
    assert UnitTestReward(backend="process").check(code, tests).status == "correct"


# ---- the wire form -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**200),
        1.5,
        -0.0,
        float("inf"),
        1 + 2j,
        "é\udc80",
        b"\x00\xff",
        [1, [2, (3,)]],
        {"a": {1: frozenset({2})}, (1, 2): {3}},
    ],
)
def test_wire_values_round_trip_exactly(value: object) -> None:
    back = decode(json.loads(dumps(encode(value))))
    assert type(back) is type(value) and repr(back) == repr(value)


def test_wire_is_type_strict_and_bounded() -> None:
    class Sub(int):
        pass

    for value in (Sub(1), NotImplemented, ..., print, object(), iter([])):
        with pytest.raises(Unsendable):
            encode(value)
    deep: list[object] = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(Unsendable):
        encode(deep)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(Unsendable):
        encode(loop)
    for bad in (1.5, ["x", 1], ["l", 1], ["d", [[["l", []], 1]]], ["f", "0x" + "1" * 100], {}):
        with pytest.raises(ValueError):
            decode(bad)
    nested: object = 1
    for _ in range(10_000):
        nested = ["l", [nested]]
    with pytest.raises(ValueError, match="deeper"):
        decode(nested)


def test_discovery_finds_a_loops_calls_in_one_round_strict_rounds_one_by_one() -> None:
    tests = "for x in range(20):\n    assert f(x) == 2 * x\nassert f(100) == 200\n"
    spec = JudgeSpec(tests, "program", None, "", "def f(x):\n    return 2 * x\n", 5.0, False)
    discovery, strict = judge_round(spec, {}, True), judge_round(spec, {}, False)
    assert not discovery.decided and len(discovery.calls) == 21
    assert not strict.decided and [c.args for c in strict.calls] == [["l", [0]], ["l", [100]]]
    # placeholders never count: a round decides only on known answers
    answers = {c.key: dumps({"ok": 2 * c.args[1][0]}) for c in discovery.calls}
    final = judge_round(spec, answers, True)
    assert (final.decided, final.passed, final.total, final.calls) == (True, 2, 2, ())
    answers[discovery.calls[5].key] = dumps({"ok": 11})
    assert judge_round(spec, answers, True).passed == 1


def test_reading_the_sandbox_output_is_robust() -> None:
    spec = JudgeSpec(("assert f(1) == 2",), "cases", "f", "", "def f(x): ...", 5.0, False)
    calls = judge_round(spec, {}, True).calls
    (key,) = [c.key for c in calls]
    stdout = "\n".join(
        [
            "garbage @areal:R",
            '@areal:L - {"ok":true}',
            '@areal:R 1 {"ok":2}',  # ids are the calls' places in the batch: 0 only here
            f'@areal:R {key} {{"ok":2}}',
            "@areal:R 0 not json",
            f"@areal:R 0 {'[' * 100000}",
            'text before @areal:R 0 {"ok":2}',
            '@areal:R 0 {"ok":3}',
            '@areal:D - ""',
        ]
    )
    run = _read(ExecResult(stdout=stdout, stderr="", exit_code=0), calls)
    assert run.answers == {key: '{"ok":2}'}  # first readable line for a known id wins
    assert judge_round(spec, run.answers, True).passed == 1
    for payload in ('{"ok":["l",' * 5000 + "1" + "]]" * 5000 + "}", '{"ok":["q",1]}', "{}"):
        found = judge_round(spec, {key: payload}, True)
        assert found.decided and found.passed == 0, payload
