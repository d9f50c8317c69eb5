"""The values a solution returns, judged as plain Python judges them (issue 28 M3).

What Python says of a plain value (``True == 1``, ``frozenset({1}) == {1}``), the unit-test
judge says too; a value built to fool or stall the comparison (a huge integer, a
self-referencing list, a ``str`` subclass equal to everything) scores 0. On the ``process``
backend: what is under test is the judge on the host.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from areal_agents.rewards import RewardResult, UnitTestReward, UnitTests
from areal_agents.sandboxes import BaseSandbox, make_sandbox

JUDGE = UnitTestReward(timeout_s=20, case_timeout_s=2)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[BaseSandbox]:
    with make_sandbox("process") as sb:
        yield sb


def verdict(sandbox: BaseSandbox, test: str, code: str) -> RewardResult:
    """The judge's verdict on ``code`` (defining ``f``) under the one test ``test``."""
    return JUDGE.check(code, UnitTests(tests=(test,), entry_point="f"), sandbox=sandbox)


# Values of the solution are plain values: what Python says of them, the judge says too.
PLAIN_PYTHON = [
    ("bool_for_int", "assert f(1) == 1", "def f(x):\n    return True\n"),
    ("nan_is_not_less", "assert not f(1) < 0", "def f(x):\n    return float('nan')\n"),
    ("frozenset_for_set", "assert f(1) == {1, 2}", "def f(x):\n    return frozenset({1, 2})\n"),
]
_F = "def f(x):\n    return "
HOSTILE_VALUES = [
    ("huge_int", "assert f(1) == 5", _F + "10**40000\n"),
    ("huge_int_as_str", "assert str(f(1)) == '5'", _F + "10**40000\n"),
    ("deep_list", "assert f(1) == [1]", "def f(x):\n    a = [1]\n    for _ in range(99): a = [a]\n"
     "    return a\n"),
    ("self_referencing_list", "assert f(1) == [1]", "def f(x):\n    a = [1]\n    a.append(a)\n"
     "    return a\n"),
    ("shared_sublists", "assert f(1) == [1]", "def f(x):\n    a = [1]\n"
     "    for _ in range(40): a = [a, a]\n    return a\n"),
    ("bytes_for_str", "assert f(1) == 'ab'", _F + "b'ab'\n"),
    ("str_subclass_equal_to_all", "assert f(1) == 'ab'",
     "class S(str):\n    def __eq__(s, o): return True\n" + _F + "S('zz')\n"),
    ("int_subclass_equal_to_all", "assert f(1) == 7",
     "class I(int):\n    def __eq__(s, o): return True\n    __hash__ = int.__hash__\n"
     + _F + "I(3)\n"),
    ("dict_order", "assert list(f(1)) == ['a', 'b']", _F + "{'b': 2, 'a': 1}\n"),
    ("negative_zero", "import math\nassert math.copysign(1, f(1)) == 1", _F + "-0.0\n"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("test", "code"), [p[1:] for p in PLAIN_PYTHON], ids=[p[0] for p in PLAIN_PYTHON]
)
def test_the_verdict_is_what_python_says_of_plain_values(
    sandbox: BaseSandbox, test: str, code: str
) -> None:
    namespace: dict[str, object] = {}
    exec(code + test, namespace)  # passes in plain Python: so it passes the judge
    assert verdict(sandbox, test, code).status == "correct"


@pytest.mark.parametrize(
    ("test", "code"), [p[1:] for p in HOSTILE_VALUES], ids=[p[0] for p in HOSTILE_VALUES]
)
def test_hostile_values_score_zero(sandbox: BaseSandbox, test: str, code: str) -> None:
    result = verdict(sandbox, test, code)
    assert result.reward == 0.0 and result.status != "correct", result
