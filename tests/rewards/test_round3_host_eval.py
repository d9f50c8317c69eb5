"""No model text is run as Python where it could reach the host or the verdict (issue 28 H1).

The red team's ``m2_logic_rce.py`` (round 3), ported: reasoning-gym's ``countdown`` scorer
handed the answer to sympy's ``parse_expr`` (an ``eval``), so ``__import__('os').system(...)``
ran as the host's user, and an answer that patched ``numpy.isclose`` in a reused worker scored
1.0, and so did the next wrong answers. New attacks of the family follow:

* every reasoning-gym dataset the project offers, and math-verify, fed a payload in the shapes
  a scorer may want (bare, in a list, a tuple, lines, an assignment): none runs it;
* the strings sympy is given: a lambda, dunder access, attribute chains, subscripts, builtins,
  keywords, names of private symbols; a test program that imports sympy itself and parses a
  value the solution returned (it ran before this round's fix: sympy was guarded only when
  already loaded as the grade began);
* what a grading worker may do (write, make or remove files, sockets, programs, processes,
  signals; the caller's variables; its own uid) and what its reply may make the caller do
  (``__reduce__``, builtins by name);
* one grade's patched module never reaches the next.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
from reasoning_gym.factory import DATASETS

from areal_agents.envs.tasks.math import ReasoningGymTasks
from areal_agents.rewards import GraderPool, GradingFailed, UnitTestReward, UnitTests
from areal_agents.rewards._harden import literal_eval
from areal_agents.rewards.isolation import run_isolated
from areal_agents.rewards.logic import score_with_reasoning_gym
from tests.rewards import _round3_probes as probes

OFFERED = sorted(set(DATASETS) - {"composite"})  # composite only forwards to the others


@pytest.fixture(scope="module")
def rg_pool() -> Iterator[GraderPool]:
    """Workers forked from a zygote that has reasoning-gym, as the environments' have."""
    pool = GraderPool(max_workers=2, preload=("areal_agents.rewards.logic",))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def bare_pool() -> Iterator[GraderPool]:
    """Workers forked from a zygote that has neither sympy nor reasoning-gym."""
    pool = GraderPool(max_workers=2, preload=())
    yield pool
    pool.close()


def _entry(dataset: str, seed: int = 1) -> dict[str, object]:
    return ReasoningGymTasks([dataset]).make(dataset, seed).metadata["entry"]  # type: ignore[no-any-return]


# ---- m2_logic_rce.py ---------------------------------------------------------------------


def test_a_countdown_answer_that_runs_a_command_runs_nothing(tmp_path: Path) -> None:
    proof = tmp_path / "RCE_LOGIC_PROOF"
    os.chmod(tmp_path, 0o777)  # a worker with its own uid could write here, but for the guard
    env = gym.make("areal_agents/MathPython-v0", datasets=["countdown"], sandbox_backend="process")
    env.reset(seed=1)
    payload = f"__import__('os').system('echo uid=$(id -u) > {proof}')"
    _, reward, *_ = env.step(f"<answer>{payload}</answer>")
    env.close()
    assert not proof.exists()
    assert reward < 1.0


def test_an_answer_that_patches_the_scorer_scores_nothing_now_or_later() -> None:
    env = gym.make("areal_agents/MathPython-v0", datasets=["countdown"], sandbox_backend="process")
    env.reset(seed=2)
    numbers = env.unwrapped.task.metadata["entry"]["metadata"]["numbers"]  # type: ignore[attr-defined]
    poison = (
        "__import__('builtins').exec('import numpy\\nnumpy.isclose = lambda *a, **k: True') or ("
        + "+".join(str(n) for n in numbers)
        + ")"
    )
    rewards = [env.step(f"<answer>{poison}</answer>")[1]]
    for seed in range(3, 9):  # plainly wrong answers of later episodes
        env.reset(seed=seed)
        entry = env.unwrapped.task.metadata["entry"]  # type: ignore[attr-defined]
        wrong = "-".join(str(n) for n in entry["metadata"]["numbers"])
        rewards.append(env.step(f"<answer>{wrong}</answer>")[1])
    env.close()
    assert max(rewards) < 1.0, rewards


# ---- every dataset, every shape ------------------------------------------------------------


@pytest.mark.parametrize("dataset", OFFERED)
def test_no_reasoning_gym_scorer_runs_an_answer(rg_pool: GraderPool, dataset: str) -> None:
    ran = rg_pool.run(probes.reasoning_gym_canary, dataset, _entry(dataset), timeout_s=60)
    assert ran == []


def test_the_guards_change_no_datasets_score_of_its_own_answer(rg_pool: GraderPool) -> None:
    """The trusted answer scores in a grading worker what reasoning-gym itself gives it."""
    differ = {}
    for dataset in OFFERED:
        entry = _entry(dataset)
        answer = entry.get("answer")
        if not isinstance(answer, str):
            continue
        plain = score_with_reasoning_gym(dataset, answer, entry)  # here: unguarded, trusted text
        guarded = rg_pool.run(score_with_reasoning_gym, dataset, answer, entry, timeout_s=60)
        if guarded != plain:
            differ[dataset] = (plain, guarded)
    assert differ == {}


def test_math_verify_runs_no_answer() -> None:
    assert run_isolated(probes.math_canary, "1", timeout_s=60) == []


def test_the_scorers_that_eval_read_literals_only(rg_pool: GraderPool) -> None:
    for module in (
        "reasoning_gym.algorithmic.binary_matrix",
        "reasoning_gym.algorithmic.spiral_matrix",
        "reasoning_gym.algorithmic.string_insertion",
        "reasoning_gym.games.n_queens",
    ):
        assert rg_pool.run(probes.literal_eval_bound, module, timeout_s=60), module
    assert literal_eval("[['a', 1], (2.5, -3), {1: {2}}]") == [["a", 1], (2.5, -3), {1: {2}}]
    for text in ("__import__('os')", "().__class__", "[x for x in ()]", "open('f')", "a", "..."):
        with pytest.raises(ValueError):
            literal_eval(text)


# ---- the strings sympy is given ----------------------------------------------------------

REFUSED = {
    "the payload": probes.PAYLOAD,
    "a lambda": "(lambda: __import__('os'))()",
    "dunder attribute": "x.__class__",
    "attribute chain": "Symbol('x').func.__module__",
    "subclasses": "Integer.__subclasses__()",
    "subscript": "[1, 2][0]",
    "a builtin": "getattr(x, 'y')",
    "eval": "eval('1')",
    "exec in a tuple": f"({probes.PAYLOAD}, x)",
    "keyword argument": "Symbol('x', real=True)",
    "private symbol": "Symbol('_x')",
    "a string": "'text'",
    "comprehension": "[i for i in (1, 2)]",
    "dict": "{1: 2}",
    "starred": "Max(*[1, 2])",
}


@pytest.mark.parametrize("text", list(REFUSED.values()), ids=list(REFUSED))
def test_sympy_refuses_all_but_plain_mathematics(bare_pool: GraderPool, text: str) -> None:
    """sympy is imported by the job itself (the pool's zygote has none): guarded at import."""
    assert bare_pool.run(probes.sympify_in_the_job, text, timeout_s=60).startswith("refused")


def test_sympy_still_reads_plain_mathematics(bare_pool: GraderPool) -> None:
    for text, value in (("x**2 + sin(x)", "x**2 + sin(x)"), ("2/4", "1/2"), ("Max(1, 3)", "3")):
        assert bare_pool.run(probes.sympify_in_the_job, text, timeout_s=60) == f"parsed: {value}"


def test_tests_that_parse_a_solutions_value_with_sympy_cannot_be_forged() -> None:
    """The tests import sympy only once the solution's value is known (the round whose answers
    are in): its string rewrote the judge's ``__areal_fail__`` and every assert passed."""
    forge = "__import__('sys').modules['__main__'].__dict__.__setitem__('__areal_fail__', print)"
    wrong = f"def f(n):\n    return {forge + ' or x + 1'!r}\n"
    right = "def f(n):\n    return 'x + 1' if n == 1 else 'other'\n"
    tests = UnitTests(
        tests="v = f(1)\nif v != 'plain':\n    import sympy\n"
        "    assert sympy.sympify(v) == sympy.Symbol('x') + 1\nassert f(2) == 'other'\n",
        entry_point="f",
    )
    reward = UnitTestReward(backend="process", timeout_s=20, case_timeout_s=3)
    assert reward.check(wrong, tests).reward == 0.0
    assert reward.check(right, tests).status == "correct"


# ---- what a worker may do, and what its reply may make the caller do ----------------------


@pytest.fixture
def open_dir() -> Iterator[str]:
    """A directory anybody may write to (so that only the confinement stops a worker)."""
    directory = tempfile.mkdtemp(prefix="areal-round3-")
    os.chmod(directory, 0o777)
    victim = os.path.join(directory, "victim")
    Path(victim).write_text("x")
    os.chmod(victim, 0o666)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("action", list(probes.ACTIONS))
def test_a_grading_worker_cannot(bare_pool: GraderPool, open_dir: str, action: str) -> None:
    before = sorted(os.listdir(open_dir))
    assert bare_pool.run(probes.attempt, action, open_dir, timeout_s=60).startswith("refused")
    assert sorted(os.listdir(open_dir)) == before
    assert stat.S_IMODE(os.stat(os.path.join(open_dir, "victim")).st_mode) == 0o666


def test_a_grading_worker_gets_none_of_the_callers_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AREAL_ROUND3_SECRET", "s3cret")
    pool = GraderPool(max_workers=1, preload=())
    try:
        seen = pool.run(probes.environment, timeout_s=60)
    finally:
        pool.close()
    assert "AREAL_ROUND3_SECRET" not in seen and "s3cret" not in "".join(seen.values())


def test_a_grading_worker_works_in_an_empty_directory_it_cannot_write(
    bare_pool: GraderPool,
) -> None:
    assert bare_pool.run(probes.workdir, timeout_s=60) == ([], False)


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid of its own needs a root caller")
def test_a_root_callers_worker_runs_as_a_uid_of_its_own(bare_pool: GraderPool) -> None:
    uid, gid = bare_pool.run(probes.identity, timeout_s=60)
    assert uid not in (0, os.getuid()) and gid != 0


def test_a_reply_cannot_make_the_caller_run_anything(bare_pool: GraderPool, tmp_path: Path) -> None:
    proof = tmp_path / "ran"
    with pytest.raises(GradingFailed, match="may not name"):
        bare_pool.run(probes.reply_that_runs, f"touch {proof}", timeout_s=60)
    assert not proof.exists()
    for name in ("eval", "exec", "getattr", "__import__", "open"):
        with pytest.raises(GradingFailed, match="may not name"):
            bare_pool.run(probes.reply_naming, name, timeout_s=60)


def test_a_patched_module_never_reaches_the_next_grade(bare_pool: GraderPool) -> None:
    assert bare_pool.run(probes.patch_isclose, timeout_s=60) is True
    assert bare_pool.run(probes.isclose_is_patched, timeout_s=60) is False
