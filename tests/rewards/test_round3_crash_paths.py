"""Nothing a solution returns or raises makes a grade raise, or hang past its limits (issue 28
H6 and M1).

The red team's ``g3_crashpaths.py`` (round 3), ported at the reward (the environment's probes
are in ``tests/envs/test_round3_env_crash.py``): a wrong solution returning ``10**6000``
against ``assert f(1) == 5, f(1)`` raised ``ValueError: Exceeds the limit (4300 digits)`` out
of the grade, because the judge formatted its message with ``str()``; so did a dict lookup by
that value and a list message. A lone surrogate in a message reached the details, and the
end-of-run transcript viewer. New attacks of the family: other formatting of the value
(f-strings, ``format``, ``%``), recursive values, messages whose ``__repr__``, ``__str__`` or
``__format__`` raises or never returns (it held a grade for its whole ``timeout_s``: the
failure was described after the case alarm was off), huge floats and numeric strings, an
exception the solution raises with a huge int, and a grading worker's own exception holding
one (the caller formatted it: ``ValueError`` instead of a grading failure).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_agents.rewards import GraderPool, GradingFailed, UnitTestReward, UnitTests
from areal_agents.sandboxes import BaseSandbox, make_sandbox
from areal_agents.trainers.step_records import write_transcript_viewer
from tests.rewards import _round3_probes as probes

REWARD = UnitTestReward(timeout_s=20, case_timeout_s=2)
HUGE = "def f(x):\n    return 10**6000\n"
RIGHT = "def f(x):\n    return 5\n"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[BaseSandbox]:
    with make_sandbox("process") as sb:
        yield sb


def _utf8(value: object) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


G3_HUGE = {
    "assert_message_is_the_value": ("assert f(1) == 5, f(1)",),
    "key_error_on_the_value": ("d = {5: 1}\nassert d[f(1)] == 1",),
    "list_message": ("r = f(1)\nassert r in ([1], 5), [r]",),
    "program_mode_message": "assert f(1) == 5, f(1)\n",
    "humaneval_style_message": "def check(candidate):\n"
    "    assert candidate(1) == 5, candidate(1)\n",
}
NEW_HUGE = {
    "f_string_message": ("assert f(1) == 5, f'got {f(1)}'",),
    "format_message": ("assert f(1) == 5, '{}'.format(f(1))",),
    "percent_message": ("assert f(1) == 5, '%d' % f(1)",),
    "str_of_the_value": ("assert str(f(1)) == '5'",),
    "nested_in_a_tuple_message": ("assert f(1) == 5, (1, [f(1)], {'k': f(1)})",),
    "exception_holding_the_value": ("if f(1) != 5:\n    raise ValueError(f(1))",),
    "system_exit_with_the_value": ("import sys\nif f(1) != 5:\n    sys.exit(f(1))",),
}


@pytest.mark.parametrize(
    "tests", [*G3_HUGE.values(), *NEW_HUGE.values()], ids=[*G3_HUGE, *NEW_HUGE]
)
def test_a_huge_int_in_any_message_is_a_wrong_answer(
    sandbox: BaseSandbox, tests: str | tuple[str, ...]
) -> None:
    unit_tests = UnitTests(tests=tests, entry_point="f")
    result = REWARD.check(HUGE, unit_tests, sandbox=sandbox)
    assert (result.reward, result.status) == (0.0, "wrong"), result
    assert all(len(f) < 1000 for f in result.details["failures"]) and _utf8(result.details)
    assert REWARD.check(RIGHT, unit_tests, sandbox=sandbox).status == "correct"


HOSTILE_MESSAGES = {
    "recursive_value": "r = [f(1)]\nr.append(r)\nassert r[0] == 5, r",
    "repr_that_raises": "class B:\n    def __repr__(self):\n        raise RuntimeError('no')\n"
    "    __str__ = __repr__\nassert f(1) == 5, B()",
    "format_that_raises": "class B:\n    def __format__(self, spec):\n        raise RuntimeError\n"
    "assert f(1) == 5, f'{B()}'",
    "str_that_raises_base_exception": "class B:\n    def __str__(self):\n"
    "        raise KeyboardInterrupt\n    __repr__ = __str__\nassert f(1) == 5, B()",
    "huge_float": "assert float(f(1)) == 5.0, f(1) * 1e308",
}


@pytest.mark.parametrize("test", list(HOSTILE_MESSAGES.values()), ids=list(HOSTILE_MESSAGES))
def test_a_message_that_cannot_be_shown_is_still_a_failure(sandbox: BaseSandbox, test: str) -> None:
    wrong = "def f(x):\n    return 4\n"
    result = REWARD.check(wrong, UnitTests(tests=(test,), entry_point="f"), sandbox=sandbox)
    assert (result.reward, result.status) == (0.0, "wrong"), result
    assert _utf8(result.details)


def test_a_message_that_never_finishes_showing_is_a_case_timeout(sandbox: BaseSandbox) -> None:
    """Its ``__repr__`` loops: the case alarm ends it (not the grade's whole ``timeout_s``)."""
    looping = "class B:\n    def __repr__(self):\n        while True:\n            pass\n"
    tests = UnitTests(tests=(looping + "assert f(1) == 5, B()",), entry_point="f")
    reward = UnitTestReward(timeout_s=30, case_timeout_s=1)
    start = time.monotonic()
    result = reward.check("def f(x):\n    return 4\n", tests, sandbox=sandbox)
    assert result.reward == 0.0 and result.status == "timeout", result
    assert time.monotonic() - start < 15
    assert reward.check(RIGHT, tests, sandbox=sandbox).status == "correct"


@pytest.mark.parametrize(
    ("code", "test"),
    [
        ("def f(x):\n    raise ValueError(10**6000)\n", "assert f(1) == 5"),
        ("def f(x):\n    return '9' * 5000\n", "assert int(f(1)) == 5"),
        ("def f(x):\n    return '9' * 5000\n", "assert float(f(1)) == 5"),
        ("def f(x):\n    return 1e308 * 10\n", "assert f(1) == 5.0, f(1)"),
    ],
    ids=["raised_with_a_huge_int", "int_of_a_long_string", "float_of_a_long_string", "inf"],
)
def test_values_at_pythons_limits_are_wrong_answers(
    sandbox: BaseSandbox, code: str, test: str
) -> None:
    result = REWARD.check(code, UnitTests(tests=(test,), entry_point="f"), sandbox=sandbox)
    assert (result.reward, result.status) == (0.0, "wrong"), result


def test_a_lone_surrogate_in_a_message_leaves_the_details_valid_utf8(
    sandbox: BaseSandbox,
) -> None:
    for code in (
        "def f(x):\n    raise ValueError('\\ud800 boom')\n",  # g3's judge_surrogate_message
        "def f(x):\n    return '\\udcff' * 3\n",
        "def f(x):\n    raise KeyError('\\udfff')\n",
    ):
        tests = UnitTests(tests=("assert f(1) == 5, f(1)",), entry_point="f")
        result = REWARD.check(code, tests, sandbox=sandbox)
        assert result.status == "wrong" and _utf8(result.details), result


@pytest.mark.parametrize(
    "code",
    ["def f(x):\n    return 5\x00\n", "def f(x):\n    return " + "[" * 200000 + "\n"],
    ids=["nul_byte", "deep_brackets"],
)
def test_a_solution_the_parser_refuses_is_an_error(sandbox: BaseSandbox, code: str) -> None:
    tests = UnitTests(tests=("assert f(1) == 5",), entry_point="f")
    result = REWARD.check(code, tests, sandbox=sandbox)
    assert (result.reward, result.status) == (0.0, "error"), result


def test_the_end_of_run_viewer_writes_a_surrogate(tmp_path: Path) -> None:
    row = {
        "step": 1,
        "task_id": "gen/add/7",
        "reward": 0.0,
        "info": {"reward_details": {"status": "wrong", "failures": ["ValueError: \ud800 nope"]}},
    }
    (tmp_path / "transcripts.jsonl").write_text(json.dumps(row) + "\n")  # as metrics.py writes
    write_transcript_viewer(tmp_path, {"steps": 1})
    assert (tmp_path / "transcripts.html").read_bytes().decode("utf-8")


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "SystemExit", "GeneratorExit"])
def test_a_workers_exception_holding_a_huge_int_is_a_grading_failure(kind: str) -> None:
    pool = GraderPool(max_workers=1, preload=())
    try:
        with pytest.raises(GradingFailed, match=kind):
            pool.run(probes.raise_with_a_huge_int, kind, timeout_s=60)
    finally:
        pool.close()
