"""The long-tail calculator dialogue used by the async-vs-sync benchmark."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from areal_agents.envs.registry import make_env
from benchmarks.workloads import ENV_ID, LongTailCalculator


def _answer_all(env, wrong_rounds=()):  # type: ignore[no-untyped-def]
    base = env.unwrapped
    round_no, turns = 0, 0
    while True:
        expression = base.task.prompt[len("What is ") : -1]
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        obs, _, _, _, _ = env.step(f"<tool_call>\n{call}\n</tool_call>")
        value = int(obs[0]["content"]) + (1 if round_no in wrong_rounds else 0)
        obs, reward, term, trunc, _info = env.step(f"The answer is \\boxed{{{value}}}.")
        turns += 2
        round_no += 1
        if term or trunc:
            return reward, term, trunc, turns, round_no
        assert obs == [{"role": "user", "content": base.task.prompt}]


def test_rounds_have_a_long_tail() -> None:
    env = make_env(ENV_ID)
    counts = Counter(env.reset(seed=s)[1]["rounds"] for s in range(400))
    assert set(counts) == {1, 2, 4, 8}
    assert counts[1] > counts[2] > counts[8] > 10  # most short, some long


def test_a_dialogue_asks_every_question_and_scores_the_accuracy() -> None:
    env = make_env(ENV_ID)
    seed = next(s for s in range(100) if env.reset(seed=s)[1]["rounds"] == 4)
    env.reset(seed=seed)
    reward, term, trunc, turns, rounds = _answer_all(env)
    assert (reward, term, trunc, turns, rounds) == (1.0, True, False, 8, 4)
    env.reset(seed=seed)
    reward, *_ = _answer_all(env, wrong_rounds={0, 2, 3})
    assert reward == pytest.approx(0.25)


def test_the_same_seed_gives_the_same_dialogue() -> None:
    a, b = LongTailCalculator(), LongTailCalculator()
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]
    assert a.task is not None and b.task is not None and a.task.id == b.task.id


def test_max_turns_truncates_a_long_dialogue() -> None:
    env = LongTailCalculator(rounds=(3,), weights=(1.0,), max_turns=4)
    env.reset(seed=0)
    reward, term, trunc, turns, _rounds = _answer_all(env)
    assert (term, trunc, turns, reward) == (False, True, 4, 0.0)


def _call(env) -> str:  # type: ignore[no-untyped-def]
    expression = env.unwrapped.task.prompt[len("What is ") : -1]
    return "<tool_call>" + json.dumps(
        {"name": "calculator", "arguments": {"expression": expression}}
    ) + "</tool_call>"  # fmt: skip


def test_a_question_out_of_turns_scores_0_and_the_next_is_asked() -> None:
    env = LongTailCalculator(rounds=(2,), weights=(1.0,))
    assert env.max_turns == 4  # turns_per_question x the longest dialogue
    env.reset(seed=3)
    first, second = (q.prompt for q in env._questions)
    env.step(_call(env))
    obs, reward, term, trunc, _ = env.step(_call(env))  # a second call: question 1 is over
    assert (reward, term, trunc) == (0.0, False, False)
    assert obs[0]["role"] == "tool" and obs[-1] == {"role": "user", "content": second}
    assert first != second
    value = int(env.step(_call(env))[0][0]["content"])
    obs, reward, term, trunc, info = env.step(f"\\boxed{{{value}}}")
    assert (reward, term, trunc, info["rounds_correct"]) == (0.5, True, False, 1)


def test_a_policy_that_never_answers_ends_after_its_turns_per_question() -> None:
    for per_question in (1, 2, 3):
        env = LongTailCalculator(rounds=(4,), weights=(1.0,), turns_per_question=per_question)
        env.reset(seed=0)
        turns, term, trunc = 0, False, False
        while not (term or trunc):
            _, reward, term, trunc, _ = env.step(_call(env))
            turns += 1
        assert (turns, reward, term, trunc) == (4 * per_question, 0.0, True, False)
        with pytest.raises(Exception, match="reset"):
            env.step("\\boxed{1}")
