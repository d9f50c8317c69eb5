"""A unit-test verdict that no test shape can fool (issue 28 H4, H5 and M3).

The red team's ``g1_forge.py`` (round 3), ported: each attack is a set of tests, a wrong
solution (it scores only if the judge is fooled) and, where the tests are sound, the honest
solution. The wrong one must score 0, the honest one 1. New attacks of each family follow the
ported ones. Everything runs on the ``process`` backend: what is under test is the judge on
the host, which is the same whatever the sandbox.

* **H4**, the check is not an ``assert`` statement where it runs: a test function called
  later or never (pytest collects it), a ``__main__`` guard, ``raise`` in an ``if``, an exit
  status, unittest run or collected, pytest's ``Test*`` classes, a generator consumed later.
* **H5**, the tests catch what decides: a bare ``except``, ``except BaseException``,
  ``contextlib.suppress``, ``finally: return``, ``__del__``, ``except*``, a swapped alarm
  handler, unittest's own failures caught inside the test, a test that skips itself.
* **M3**, edge cases: an honest solution with thousands of calls, names the solution shares
  with the tests, the host's modules, mutated arguments (plain values: ``..._values.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from areal_agents.rewards import RewardResult, UnitTestReward, UnitTests
from areal_agents.sandboxes import BaseSandbox, make_sandbox

ALL = UnitTestReward(timeout_s=20, case_timeout_s=2)
FRACTION = UnitTestReward(mode="fraction", timeout_s=20, case_timeout_s=2)

GOOD_ADD = "def add(a, b):\n    return a + b\n"
BAD_ADD = "def add(a, b):\n    return 0\n"
GOOD_DIV = (
    "def div(a, b):\n    if b == 0:\n        raise ZeroDivisionError('b')\n    return a // b\n"
)
# wrong answers to "div(1, 0) must raise": each returns or ends in a way the judge must fail
GEN_DIV = "def div(a, b):\n    if b == 0:\n        return (i for i in ())\n    return a // b\n"
OBJECT_DIV = "def div(a, b):\n    if b == 0:\n        return object()\n    return a // b\n"
LOOP_DIV = (
    "def div(a, b):\n    if b == 0:\n        while True:\n            pass\n    return a // b\n"
)
EXIT_DIV = "import os\ndef div(a, b):\n    if b == 0:\n        os._exit(3)\n    return a // b\n"
ZERO_DIV = "def div(a, b):\n    if b == 0:\n        return 0\n    return a // b\n"
INTERRUPT_DIV = (
    "def div(a, b):\n    if b == 0:\n        raise KeyboardInterrupt\n    return a // b\n"
)
SYSEXIT_DIV = "def div(a, b):\n    if b == 0:\n        raise SystemExit(0)\n    return a // b\n"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[BaseSandbox]:
    with make_sandbox("process") as sb:
        yield sb


def grade(
    sandbox: BaseSandbox,
    tests: str | tuple[str, ...],
    code: str,
    entry: str | None,
    reward: UnitTestReward = ALL,
) -> RewardResult:
    return reward.check(code, UnitTests(tests=tests, entry_point=entry), sandbox=sandbox)


# (id, tests, wrong solution, honest solution or None, entry point)
Attack = tuple[str, "str | tuple[str, ...]", str, "str | None", "str | None"]

_UNITTEST = "import unittest\nclass T(unittest.TestCase):\n"
_MUST_RAISE = "try:\n    div(1, 0)\nexcept:\n    pass\nelse:\n    assert False, 'must raise'\n"

H4_G1: list[Attack] = [
    (
        "def_then_call",
        "def test():\n    assert add(1, 2) == 3\n    assert add(2, 2) == 4\n\ntest()\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "main_guard",
        "def test_add():\n    assert add(1, 2) == 3\n\n"
        "if __name__ == '__main__':\n    test_add()\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "check_without_entry_point",
        "def check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(add)\n",
        BAD_ADD,
        GOOD_ADD,
        None,
    ),
    (
        "trailing_raise",
        "assert add(1, 2) == 3\nif add(2, 2) != 4:\n    raise AssertionError('add(2,2)')\n",
        "def add(a, b):\n    return 3 if (a, b) == (1, 2) else 0\n",
        GOOD_ADD,
        "add",
    ),
    (
        "unittest_main",
        _UNITTEST + "    def test_a(self):\n        self.assertEqual(add(1, 2), 3)\n"
        "unittest.main(exit=False)\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
]

H4_NEW: list[Attack] = [
    ("exit_status", "import sys\nif add(1, 2) != 3:\n    sys.exit(1)\n", BAD_ADD, GOOD_ADD, "add"),
    ("exit_builtin", "if add(1, 2) != 3:\n    exit(2)\n", BAD_ADD, GOOD_ADD, "add"),
    (
        "raise_system_exit",
        "if add(1, 2) != 3:\n    raise SystemExit('no')\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "raise_inside_a_called_function",
        "def test():\n    if add(1, 2) != 3:\n        raise AssertionError('add')\ntest()\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "must_raise_function_called",
        "def test():\n"
        + "".join("    " + line + "\n" for line in _MUST_RAISE.splitlines())
        + "test()\n",
        ZERO_DIV,
        GOOD_DIV,
        "div",
    ),
    (
        "must_raise_function_never_called",
        "def test_div():\n" + "".join("    " + line + "\n" for line in _MUST_RAISE.splitlines()),
        ZERO_DIV,
        GOOD_DIV,
        "div",
    ),
    (
        "generator_consumed_later",
        "def gen():\n    for i in range(3):\n        assert add(i, 1) == i + 1\n        yield i\n"
        "g = gen()\nfor _ in g:\n    pass\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "generator_expression_in_all",
        "checks = (add(i, 1) == i + 1 for i in range(3))\nassert all(checks)\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "atexit_registered_test",
        "import atexit\ndef test_add():\n    assert add(1, 2) == 3\natexit.register(test_add)\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "decorated_test_function",
        "import functools\ndef deco(f):\n    @functools.wraps(f)\n    def w():\n"
        "        return f()\n    return w\n@deco\ndef test_add():\n    assert add(1, 2) == 3\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "nested_function_in_check",
        "def check(candidate):\n    def inner():\n        assert candidate(1, 2) == 3\n"
        "    inner()\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "pytest_class",
        "class TestAdd:\n    def test_one(self):\n        assert add(1, 2) == 3\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "unittest_collected",
        _UNITTEST + "    def test_a(self):\n        self.assertEqual(add(1, 2), 3)\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "unittest_subtests_collected",
        _UNITTEST + "    def test_a(self):\n        for i in range(3):\n"
        "            with self.subTest(i=i):\n                self.assertEqual(add(i, 1), i + 1)\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "unittest_expected_failure",
        _UNITTEST + "    @unittest.expectedFailure\n    def test_a(self):\n"
        "        self.assertEqual(add(1, 2), 4)\nunittest.main(exit=False)\n",
        "def add(a, b):\n    return 4\n",
        GOOD_ADD,
        "add",
    ),
]

H5_G1: list[Attack] = [
    ("bare_except_unsendable", (_MUST_RAISE, "assert div(6, 3) == 2\n"), GEN_DIV, GOOD_DIV, "div"),
    ("bare_except_timeout", (_MUST_RAISE, "assert div(6, 3) == 2\n"), LOOP_DIV, GOOD_DIV, "div"),
    ("bare_except_crash", (_MUST_RAISE, "assert div(6, 3) == 2\n"), EXIT_DIV, GOOD_DIV, "div"),
    (
        "base_exception_unsendable",
        (_MUST_RAISE.replace("except:", "except BaseException:"), "assert div(6, 3) == 2\n"),
        OBJECT_DIV,
        GOOD_DIV,
        "div",
    ),
    (
        "custom_class_named_like_a_builtin",
        ("try:\n    div(1, 0)\nexcept ZeroDivisionError:\n    pass\nelse:\n    assert False\n",),
        "class ZeroDivisionError(Exception): pass\n"
        "def div(a, b):\n    raise ZeroDivisionError('x')\n",
        GOOD_DIV,
        "div",
    ),
    (
        "generator_exit_in_a_loop",
        ("for i in range(3):\n    assert add(i, 1) == i + 1\n",),
        "def add(a, b):\n    raise GeneratorExit\n",
        GOOD_ADD,
        "add",
    ),
    (
        "exception_group",
        ("try:\n    add(1, 1)\nexcept* ValueError:\n    pass\nelse:\n    assert False\n",),
        "def add(a, b):\n    raise ExceptionGroup('x', [ValueError('y')])\n",
        "def add(a, b):\n    raise ValueError('y')\n",
        "add",
    ),
]

_SUPPRESS = (
    "import contextlib\nwith contextlib.suppress(BaseException):\n    div(1, 0)\n"
    "    assert False, 'must raise'\nassert div(6, 3) == 2\n"
)
_FINALLY = (
    "def t():\n    try:\n        div(1, 0)\n        assert False, 'must raise'\n"
    "    except ZeroDivisionError:\n        pass\n    finally:\n        return\n"
    "t()\nassert div(6, 3) == 2\n"
)
H5_NEW: list[Attack] = [
    ("suppress_base_exception_timeout", _SUPPRESS, LOOP_DIV, GOOD_DIV, "div"),
    ("suppress_base_exception_unsendable", _SUPPRESS, GEN_DIV, GOOD_DIV, "div"),
    ("finally_return_timeout", _FINALLY, LOOP_DIV, GOOD_DIV, "div"),
    ("finally_return_no_raise", _FINALLY, ZERO_DIV, GOOD_DIV, "div"),
    (
        "del_swallows",
        "class C:\n    def __del__(self):\n        try:\n            div(1, 0)\n        except:\n"
        "            pass\nC()\nassert div(6, 3) == 2\n",
        LOOP_DIV,
        GOOD_DIV,
        "div",
    ),
    (
        "except_star_base_exception",
        "try:\n    div(1, 0)\nexcept* BaseException:\n    pass\nelse:\n    assert False\n"
        "assert div(6, 3) == 2\n",
        GEN_DIV,
        GOOD_DIV,
        "div",
    ),
    (
        "solution_keyboard_interrupt",
        (_MUST_RAISE, "assert div(6, 3) == 2"),
        INTERRUPT_DIV,
        GOOD_DIV,
        "div",
    ),
    ("solution_system_exit", (_MUST_RAISE, "assert div(6, 3) == 2"), SYSEXIT_DIV, GOOD_DIV, "div"),
    (
        "alarm_handler_swapped",
        "import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)\n"
        + _MUST_RAISE
        + "assert div(6, 3) == 2\n",
        LOOP_DIV,
        GOOD_DIV,
        "div",
    ),
    (
        "unittest_must_raise_bare_except",
        _UNITTEST + "    def test_raises(self):\n        try:\n            div(1, 0)\n"
        "        except:\n            pass\n        else:\n            self.fail('must raise')\n"
        "unittest.main(exit=False)\n",
        GEN_DIV,
        GOOD_DIV,
        "div",
    ),
    (
        "unittest_catches_its_own_failure",
        _UNITTEST
        + "    def test_a(self):\n        try:\n            self.assertEqual(add(1, 2), 3)\n"
        "        except BaseException:\n            pass\nunittest.main(exit=False)\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "unittest_skips_itself",
        _UNITTEST + "    def test_a(self):\n        if add(1, 2) != 3:\n"
        "            self.skipTest('not today')\nunittest.main(exit=False)\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
]

_FORGE_LINES = (
    "import os, sys, json, hashlib\ndef add(a, b):\n    return 0\ntry:\n"
    "    g = sys.modules['__main__'].__dict__\n    for fd in range(3, 20):\n        try:\n"
    "            for k, v in [((1, 2), 3), ((5, 5), 10)]:\n"
    "                key = hashlib.sha256(g['dumps'](['call', 'add', g['encode'](list(k)), "
    "g['encode']({})]).encode()).hexdigest()[:24]\n"
    "                os.write(fd, ('\\n@areal:R ' + key + ' ' + g['dumps']({'ok': v}) + '\\n')"
    ".encode())\n        except OSError:\n            pass\nexcept Exception:\n    pass\n"
)
M3_G1: list[Attack] = [
    (
        "test_name_used_before_the_test_binds_it",
        "assert add(1, 2) == EXPECTED\nEXPECTED = 3\n",
        "EXPECTED = 0\ndef add(a, b):\n    return 0\n",
        None,  # the tests themselves raise NameError: nobody can pass them
        "add",
    ),
    (
        "host_module_not_the_solutions",
        "assert add(1, 2) == operator.add(1, 2)\n",
        "import operator\ndef add(a, b):\n    return 0\n",
        "import operator\n" + GOOD_ADD,
        "add",
    ),
    (
        "forged_answer_lines",
        ("assert add(1, 2) == 3", "assert add(5, 5) == 10"),
        _FORGE_LINES,
        GOOD_ADD,
        "add",
    ),
    (
        "mutated_expected_argument",
        ("xs = [3, 1, 2]\nexp = [1, 2, 3]\nassert srt(xs) == exp",),
        "def srt(xs):\n    return []\n",
        "def srt(xs):\n    return sorted(xs)\n",
        "srt",
    ),
    (
        "in_place_change_claimed",
        ("d = {'a': 1}\nassert f(d=d) == 2 and d == {'a': 2}",),
        "def f(d):\n    return 1\n",
        "def f(d):\n    d['a'] = 2\n    return 2\n",
        "f",
    ),
    (
        "detects_the_executor",
        ("assert add(1, 2) == 3", "assert add(2, 5) == 7"),
        "import sys\ndef add(a, b):\n    if 'main' in sys.modules['__main__'].__dict__:\n"
        "        return -1\n    return a + b\n",
        GOOD_ADD,
        "add",
    ),
]

M3_NEW: list[Attack] = [
    (
        "helper_of_the_tests_redefined",
        ("def helper(x):\n    return x + 1\nassert add(1, 2) == helper(2)",),
        "def helper(x):\n    return 0\ndef add(a, b):\n    return 0\n",
        GOOD_ADD,
        "add",
    ),
    (
        "builtin_redefined",
        ("assert len(add(1, 2)) == 3",),
        "def len(x):\n    return 3\ndef add(a, b):\n    return []\n",
        "def add(a, b):\n    return [1, 2, 3]\n",
        "add",
    ),
    (
        "module_patched_by_the_solution",
        ("import math\nassert add(1, 2) == math.floor(3.5)",),
        "import math\nmath.floor = lambda x: 0\ndef add(a, b):\n    return 0\n",
        GOOD_ADD,
        "add",
    ),
    (
        "random_inputs",
        "import random\nfor _ in range(200):\n"
        "    a, b = random.randint(0, 99), random.randint(0, 99)\n    assert add(a, b) == a + b\n",
        "import random\ndef add(a, b):\n    return random.randint(0, 198)\n",
        GOOD_ADD,
        "add",
    ),
    (
        "stateful_helper",
        "calls = []\ndef check_one(i):\n    calls.append(i)\n    assert add(i, 1) == i + 1\n"
        "for i in range(5):\n    check_one(i)\nassert len(calls) == 5\n",
        BAD_ADD,
        GOOD_ADD,
        "add",
    ),
    (
        "exception_message_checked",
        "try:\n    add(1, 'x')\nexcept TypeError as e:\n    assert 'str' in str(e)\nelse:\n"
        "    assert False\nassert add(1, 2) == 3\n",
        "def add(a, b):\n    raise TypeError('nope')\n",
        GOOD_ADD,
        "add",
    ),
]

GROUPS = {"h4": H4_G1 + H4_NEW, "h5": H5_G1 + H5_NEW, "m3": M3_G1 + M3_NEW}
WRONG = [
    pytest.param(a[1], a[2], a[4], id=f"{g}-{a[0]}")
    for g, attacks in GROUPS.items()
    for a in attacks
]
HONEST = [
    pytest.param(a[1], a[3], a[4], id=f"{g}-{a[0]}")
    for g, attacks in GROUPS.items()
    for a in attacks
    if a[3] is not None
]


@pytest.mark.parametrize(("tests", "wrong", "entry"), WRONG)
def test_a_wrong_solution_scores_zero(
    sandbox: BaseSandbox, tests: str | tuple[str, ...], wrong: str, entry: str | None
) -> None:
    result = grade(sandbox, tests, wrong, entry)
    assert result.reward == 0.0 and result.status != "correct", result
    partial = grade(sandbox, tests, wrong, entry, FRACTION)  # the attacked case fails too
    assert partial.reward < 1.0 and partial.status != "correct", partial


@pytest.mark.parametrize(("tests", "right", "entry"), HONEST)
def test_the_honest_solution_scores_one(
    sandbox: BaseSandbox, tests: str | tuple[str, ...], right: str, entry: str | None
) -> None:
    result = grade(sandbox, tests, right, entry)
    assert (result.reward, result.status) == (1.0, "correct"), result


def test_a_name_the_tests_bind_is_never_the_solutions(sandbox: BaseSandbox) -> None:
    """The tests read ``EXPECTED`` before they bind it: a NameError for everyone, never the
    solution's ``EXPECTED = 0`` (g1's prog_value_shadow)."""
    tests = "assert add(1, 2) == EXPECTED\nEXPECTED = 3\n"
    result = grade(sandbox, tests, "EXPECTED = 3\n" + GOOD_ADD, "add")
    assert result.reward == 0.0 and "NameError" in str(result.details["failures"]), result


def test_an_honest_solution_with_6000_calls_scores_one(sandbox: BaseSandbox) -> None:
    """g1's many_calls_honest: more calls than one sandbox run answers (M3: it scored 0 after
    "more than 8 sandbox runs")."""
    for tests in (
        "for i in range(6000):\n    assert add(i, 1) == i + 1\n",
        "def check(candidate):\n    for i in range(6000):\n"
        "        assert candidate(i, 1) == i + 1\n",
    ):
        result = grade(sandbox, tests, GOOD_ADD, "add")
        assert (result.reward, result.status) == (1.0, "correct"), result


def test_thousands_of_cases_and_large_arguments_are_answered(sandbox: BaseSandbox) -> None:
    cases = tuple(f"assert add({i}, 1) == {i + 1}" for i in range(3000))
    result = grade(sandbox, cases, GOOD_ADD, "add", FRACTION)
    assert (result.reward, result.details["total"]) == (1.0, 3000), result
    tests = "for i in range(2000):\n    s = 'x' * 50 + str(i)\n    assert add(s, 'y') == s + 'y'\n"
    assert grade(sandbox, tests, GOOD_ADD, "add").status == "correct"


def test_tests_looping_on_the_solutions_value_stay_within_the_time_limit(
    sandbox: BaseSandbox,
) -> None:
    """g1's host_cpu_burn_fraction: twelve cases each loop ``range(f(1))`` on the host with
    ``f(1) = 10**18`` (fraction mode does not stop at the first failure)."""
    reward = UnitTestReward(mode="fraction", timeout_s=6, case_timeout_s=1)
    tests = tuple("for _ in range(f(1)):\n    pass\nassert f(1) == 3" for _ in range(12))
    start = time.monotonic()
    result = grade(sandbox, tests, "def f(x):\n    return 10**18\n", "f", reward)
    assert result.reward == 0.0 and result.status == "timeout", result
    assert time.monotonic() - start < 6 + 10  # the limit, plus a loaded machine's slack
    assert grade(sandbox, tests, "def f(x):\n    return 3\n", "f", reward).reward == 1.0
