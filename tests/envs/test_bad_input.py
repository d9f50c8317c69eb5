"""Bad input is an observation, never an exception or a hang (issue 12, item 3: E1-E5).

Every action value reaches ``env.step`` from a model or a client; each malformed one must come
back as an error message in the observation, counted in ``info["tool_errors"]``, with the
episode going on. Configuration mistakes fail when the environment is built, naming the key.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import areal_agents  # noqa: F401  (registers the built-in environments)
from areal_agents.envs import CalculatorEnv, MultiTurnEnv, Score, Task
from areal_agents.errors import ConfigError
from areal_agents.types import ToolCall, ToolSpec, Turn

TOOL = {
    "areal_agents/Calculator-v0": ("calculator", "expression", "1+1"),
    "areal_agents/CodeSandbox-v0": ("python", "code", "print(1)"),
    "areal_agents/MathPython-v0": ("python", "code", "print(1)"),
    "areal_agents/Search-v0": ("search", "query", "capital"),
}
FAST = {"sandbox_backend": "process"}


def make(env_id: str, **kwargs: Any) -> gym.Env[Any, Any]:
    if env_id in ("areal_agents/CodeSandbox-v0", "areal_agents/MathPython-v0"):
        kwargs = {**FAST, **kwargs}
    if env_id == "areal_agents/Search-v0":
        kwargs.setdefault("kb_seed", 0)
    return gym.make(env_id, **kwargs).unwrapped


@pytest.fixture(params=sorted(TOOL), scope="module")
def env_id(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def env(env_id: str) -> Iterator[gym.Env[Any, Any]]:
    env = make(env_id)
    yield env
    env.close()


def tool_call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def good(env_id: str) -> dict[str, Any]:
    name, arg, value = TOOL[env_id]
    return {"name": name, "arguments": {arg: value}}


def step_ok(env: gym.Env[Any, Any], action: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One step that must not end the episode; the observation must be in the space."""
    obs, reward, terminated, truncated, info = env.step(action)
    assert not terminated and not truncated and reward == 0.0
    assert env.observation_space.contains(obs), obs
    for message in obs:
        message["content"].encode("utf-8")  # valid text, nothing for a tokenizer to choke on
    return obs, info


# ---- E1: nested or huge tool-call JSON ----------------------------------------------------


def raw_call(name: str, arguments: str) -> str:
    """A call whose arguments are given as raw JSON text (possibly hostile)."""
    return tool_call('{"name": "' + name + '", "arguments": ' + arguments + "}")


NESTED = {
    "100k brackets as the call": lambda n, a: tool_call("[" * 100_000),
    "100k braces as the call": lambda n, a: tool_call('{"a":' * 100_000),
    "nesting in an argument": lambda n, a: raw_call(
        n, f'{{"{a}": ' + "[" * 5000 + "]" * 5000 + "}"
    ),
    "nested arguments string": lambda n, a: tool_call(
        json.dumps({"name": n, "arguments": "[" * 100_000})
    ),
    "70 levels (under the recursion limit)": lambda n, a: raw_call(
        n, '{"a": ' * 70 + "1" + "}" * 70
    ),
    "integer past the digit limit": lambda n, a: raw_call(n, f'{{"{a}": ' + "9" * 5000 + "}"),
}


@pytest.mark.parametrize("case", list(NESTED))
def test_nested_or_huge_json_is_an_error_observation(
    env: gym.Env[Any, Any], env_id: str, case: str
) -> None:
    name, arg, _ = TOOL[env_id]
    env.reset(seed=0)
    obs, info = step_ok(env, NESTED[case](name, arg))
    assert len(obs) == 1 and obs[0]["content"].startswith("Error")
    assert info["tool_errors"]["parse"] + info["tool_errors"]["invalid_arguments"] == 1
    # the episode goes on: a good call still runs
    obs, info = step_ok(env, tool_call(json.dumps(good(env_id))))
    assert obs[0]["role"] == "tool" and not obs[0]["content"].startswith("Error")


def test_structured_calls_with_nested_arguments_are_error_observations() -> None:
    env = CalculatorEnv()
    env.reset(seed=0)
    deep = ToolCall("calculator", '{"expression": ' + "[" * 100_000 + "}", "c1")
    obs, info = step_ok(env, Turn(text="", tool_calls=(deep,)))
    assert "nested deeper" in obs[0]["content"] and info["tool_errors"]["invalid_arguments"] == 1


# ---- E2: linear-time parsing --------------------------------------------------------------


@pytest.mark.timeout(60)  # quadratic parsing took ~14 s for 100k spaces, hours for 1 MB
def test_a_megabyte_of_white_space_in_a_call_parses_quickly(env_id: str) -> None:
    env = make(env_id)
    try:
        env.reset(seed=0)
        call = good(env_id)
        body = "{" + " " * (1 << 20) + json.dumps(call)[1:]
        obs, _ = step_ok(env, tool_call(body))
        assert obs[0]["role"] == "tool"
        step_ok(env, "<tool_call>```json" + " " * (1 << 20) + "x```" + " " * (1 << 20))
    finally:
        env.close()


# ---- actions that are not text ---------------------------------------------------------------

BAD_ACTIONS: dict[str, Any] = {
    "None": None,
    "bytes": b"<tool_call>{}</tool_call>",
    "non-UTF-8 bytes": b"\xff\xfe\x00bad",
    "int": 42,
    "float": 1.5,
    "list": [{"name": "calculator"}],
    "lone surrogate": "I think \ud800 so",
    "tool_calls a string": {"content": "", "tool_calls": "abc"},
    "function a string": {"content": "", "tool_calls": [{"function": "x"}]},
    "entry without a name": {"content": "", "tool_calls": [{"function": {"arguments": "{}"}}]},
    "name null": {"content": "", "tool_calls": [{"function": {"name": None, "arguments": "{}"}}]},
    "entry not an object": {"content": "", "tool_calls": [5]},
    "content an int": {"content": 5},
    "role user": {"role": "user", "content": "hi"},
    "Turn with text None": Turn(text=None),  # type: ignore[arg-type]
    "endpoint-malformed call": Turn(text="", tool_calls=(ToolCall("", '{"oops', "c1"),)),
    "surrogate in a call name": Turn(text="", tool_calls=(ToolCall("calc\udc80", "{}", "c"),)),
    "tool_calls entries not calls": Turn(text="", tool_calls=("calculator",)),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("case", list(BAD_ACTIONS))
def test_any_action_value_is_an_error_observation_not_an_exception(
    env: gym.Env[Any, Any], case: str
) -> None:
    env.reset(seed=0)
    obs, info = step_ok(env, BAD_ACTIONS[case])  # never raised, never a final answer
    assert len(obs) == 1 and obs[0]["role"] == "user" and obs[0]["content"].startswith("Error")
    assert info["tool_errors"]["parse"] >= 1
    assert sum(info["tool_errors"].values()) == info["tool_errors"]["parse"]


def test_an_endpoint_malformed_call_is_counted_not_scored_as_an_answer() -> None:
    # the chat client's contract: a call it could not read arrives as ToolCall(name="")
    env = CalculatorEnv(max_turns=2)
    env.reset(seed=0)
    turn = Turn(text="", tool_calls=(ToolCall("", "{'expression': 1+1", "c1"),))
    obs, reward, terminated, truncated, info = env.step(turn)
    assert not terminated and reward == 0.0 and "no function name" in obs[0]["content"]
    assert info["tool_errors"]["parse"] == 1
    _, reward, terminated, truncated, info = env.step(turn)  # ends by max_turns, not answered
    assert truncated and not terminated and info["outcome"] == "max_turns"
    assert info["tool_errors"]["parse"] == 2


def test_well_formed_calls_next_to_malformed_ones_still_run() -> None:
    env = CalculatorEnv()
    env.reset(seed=0)
    action = {
        "content": "",
        "tool_calls": [
            {"id": "a", "function": {"name": "calculator", "arguments": {"expression": "2*3"}}},
            {"id": "b", "function": {"arguments": "{}"}},
        ],
    }
    obs, info = step_ok(env, action)
    assert [m["role"] for m in obs] == ["tool", "user"]  # tool results right after the call
    assert obs[0]["content"] == "6" and "no function name" in obs[1]["content"]
    assert info["tool_errors"]["parse"] == 1


@pytest.mark.parametrize("submit", ["text", "tool"])
def test_a_submission_too_deep_for_pythons_parser_scores_an_error(submit: str) -> None:
    env = make("areal_agents/CodeSandbox-v0")
    try:
        env.reset(options={"task_id": "gen/add/7"})
        code = "def add(a, b):\n    return " + "-" * 100_000 + "a"
        action = f"```python\n{code}\n```"
        if submit == "tool":
            action = tool_call(json.dumps({"name": "submit", "arguments": {"code": code}}))
        _, reward, terminated, _, info = env.step(action)
        assert terminated and reward == 0.0 and info["reward_details"]["status"] == "error"
    finally:
        env.close()


# ---- E4: calls per turn and the turn's time budget ---------------------------------------


def test_calls_past_the_per_turn_cap_are_refused_in_one_message(env_id: str) -> None:
    env = make(env_id, max_tool_calls_per_turn=3)
    try:
        env.reset(seed=0)
        obs, info = step_ok(env, tool_call(json.dumps(good(env_id))) * 200)
        assert [m["role"] for m in obs] == ["tool"] * 3 + ["user"]
        assert "200 tool calls in one turn; only the first 3 were run" in obs[-1]["content"]
        assert info["tool_errors"]["too_many_calls"] == 197 and info["tool_calls"] == 3
        assert len(env.messages[-5].tool_calls) == 3  # the conversation keeps the calls run
    finally:
        env.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _SleepTool:
    """Sleeps on a fake clock for as long as asked, or until its time limit."""

    def __init__(self, clock: _Clock, limit: float) -> None:
        self.clock, self.limit = clock, limit
        self.given: list[float] = []

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            "sleep",
            "sleep",
            {"type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"]},
        )

    def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> str:
        limit = self.limit if timeout_s is None else min(self.limit, timeout_s)
        self.given.append(limit)
        self.clock.now += min(float(arguments["s"]), limit)
        return "slept"


class _SleepEnv(MultiTurnEnv):
    def __init__(self, tool: _SleepTool, **kwargs: Any) -> None:
        self.tool = tool
        super().__init__(**kwargs)

    def make_tools(self, task: Task | None) -> Sequence[_SleepTool]:
        return (self.tool,)

    def sample_task(self, rng: np.random.Generator) -> Task:
        return Task("t", "sleep")

    def score(self, task: Task, submission: str, turn: Turn) -> Score:
        return Score(0.0)


def test_the_turn_budget_clips_each_call_and_refuses_calls_once_spent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(sys.modules[MultiTurnEnv.__module__], "time", clock)
    tool = _SleepTool(clock, limit=2.0)
    env = _SleepEnv(tool, turn_time_budget_s=5.0, max_tool_calls_per_turn=12)
    env.reset(seed=0)
    obs, info = step_ok(env, tool_call('{"name": "sleep", "arguments": {"s": 60}}') * 12)
    # 2 s, 2 s, then the 1 s that is left; the other nine are not run
    assert tool.given == [2.0, 2.0, 1.0]
    assert [m["content"] for m in obs[:3]] == ["slept"] * 3
    assert all("time budget of 5 s is used up" in m["content"] for m in obs[3:])
    assert info["tool_errors"]["time_budget"] == 9 and info["tool_calls"] == 3
    # the budget is per turn: the next turn starts with all of it
    step_ok(env, tool_call('{"name": "sleep", "arguments": {"s": 0.5}}'))
    assert tool.given[-1] == 2.0


def test_sleeping_sandbox_calls_stay_within_the_turn_budget() -> None:
    env = make("areal_agents/CodeSandbox-v0", tool_timeout_s=1.0, turn_time_budget_s=2.5)
    try:
        env.reset(seed=0)
        sleep = {"name": "python", "arguments": {"code": "import time; time.sleep(60)"}}
        start = time.monotonic()
        _, info = step_ok(env, tool_call(json.dumps(sleep)) * 12)
        elapsed = time.monotonic() - start
        assert info["tool_errors"]["too_many_calls"] == 4  # 12 calls, cap 8
        ran = info["tool_calls"]
        assert 1 <= ran <= 3 and info["tool_errors"]["time_budget"] == 8 - ran
        assert info["tool_errors"]["timeout"] == ran  # each call that ran was killed for time
        assert elapsed < 2.5 + 10  # not 12 x 1 s: the budget bounds the turn
    finally:
        env.close()


# ---- E5: configuration checked at construction ------------------------------------------

BAD_OPTIONS = [
    ("areal_agents/Calculator-v0", {"max_turns": "3"}, "max_turns='3': must be an integer"),
    ("areal_agents/Calculator-v0", {"max_turns": None}, "max_turns=None"),
    ("areal_agents/Calculator-v0", {"max_turns": 2.5}, "max_turns=2.5"),
    ("areal_agents/Calculator-v0", {"max_turns": 0}, "max_turns=0: must be at least 1"),
    ("areal_agents/Calculator-v0", {"max_trns": 3}, "'max_trns' (did you mean 'max_turns'?)"),
    ("areal_agents/Calculator-v0", {"num_operands": 0}, "num_operands=0"),
    ("areal_agents/Calculator-v0", {"max_value": 1}, "max_value=1: must be at least 2"),
    ("areal_agents/Calculator-v0", {"max_value": "99"}, "max_value='99'"),
    ("areal_agents/Calculator-v0", {"max_tool_output_chars": -5}, "max_tool_output_chars=-5"),
    ("areal_agents/Calculator-v0", {"system_prompt": 5}, "system_prompt=5"),
    ("areal_agents/Calculator-v0", {"final_tool": "calculater"}, "did you mean 'calculator'"),
    ("areal_agents/Calculator-v0", {"max_tool_calls_per_turn": 0}, "max_tool_calls_per_turn=0"),
    ("areal_agents/Calculator-v0", {"turn_time_budget_s": 0}, "turn_time_budget_s=0"),
    ("areal_agents/CodeSandbox-v0", {"tool_timeout_s": "10"}, "tool_timeout_s='10'"),
    ("areal_agents/CodeSandbox-v0", {"tool_timeout_s": 0}, "tool_timeout_s=0"),
    ("areal_agents/CodeSandbox-v0", {"tool_timeout_s": -1}, "tool_timeout_s=-1"),
    ("areal_agents/CodeSandbox-v0", {"test_timeout_s": 0}, "test_timeout_s=0"),
    ("areal_agents/CodeSandbox-v0", {"case_timeout_s": float("nan")}, "case_timeout_s=nan"),
    ("areal_agents/CodeSandbox-v0", {"reward_mode": "any"}, "reward_mode='any'"),
    ("areal_agents/CodeSandbox-v0", {"tools": "python"}, "tools='python': must be a list"),
    ("areal_agents/CodeSandbox-v0", {"tools": ["pyhton"]}, "did you mean 'python'"),
    ("areal_agents/CodeSandbox-v0", {"templates": "add"}, "templates='add'"),
    ("areal_agents/CodeSandbox-v0", {"sandbox_backend": "dokcer"}, "did you mean 'docker'"),
    (
        "areal_agents/CodeSandbox-v0",
        {"sandbox_options": {"memroy_mb": 256}},
        "sandbox_options: unknown option 'memroy_mb' (did you mean 'memory_mb'?)",
    ),
    ("areal_agents/CodeSandbox-v0", {"sandbox_options": {"memory_mb": -1}}, "memory_mb=-1"),
    ("areal_agents/CodeSandbox-v0", {"sandbox_options": {"image": 5}}, "['image']=5"),
    ("areal_agents/MathPython-v0", {"verify_timeout_s": 0}, "verify_timeout_s=0"),
    ("areal_agents/MathPython-v0", {"verify_timeout_s": "3"}, "verify_timeout_s='3'"),
    ("areal_agents/MathPython-v0", {"tool_timeout_s": 0}, "tool_timeout_s=0"),
    ("areal_agents/MathPython-v0", {"tools": ["bash"]}, "tools: unknown tool"),
    ("areal_agents/MathPython-v0", {"datasets": "chain_sum"}, "datasets='chain_sum'"),
    ("areal_agents/MathPython-v0", {"sandbox_options": {"cpu": 1}}, "did you mean 'cpus'"),
    ("areal_agents/Search-v0", {"topk": 0}, "topk=0"),
    ("areal_agents/Search-v0", {"topk": "3"}, "topk='3'"),
    ("areal_agents/Search-v0", {"kb_options": {"bogus": 1}}, "kb_options got an unknown option"),
    ("areal_agents/Search-v0", {"kb_options": {"max_hops": 9}}, "max_hops"),
    ("areal_agents/Search-v0", {"metric": "f2"}, "metric='f2'"),
]


@pytest.mark.parametrize(
    ("env_id", "kwargs", "needle"), BAD_OPTIONS, ids=[f"{e[13:-3]}-{k}" for e, k, _ in BAD_OPTIONS]
)
def test_bad_options_fail_at_construction_naming_the_key(
    env_id: str, kwargs: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        gym.make(env_id, **kwargs)
    assert needle in str(raised.value)


@pytest.mark.parametrize(
    "options",
    [{"task": "a string"}, {"task": 5}, {"task": ["prompt"]}, "notadict"],
    ids=["str", "int", "list", "options a str"],
)
def test_bad_reset_options_name_the_option(options: Any) -> None:
    env = CalculatorEnv()
    with pytest.raises(ConfigError, match="task" if isinstance(options, dict) else "options"):
        env.reset(options=options)
    env.reset(options={"task": {"prompt": "2+2?", "answer": 4}})  # and good ones still work


def test_sensible_defaults_are_accepted() -> None:
    env = CalculatorEnv(max_turns=3, num_operands=1, max_value=2, final_tool=None)
    env.reset(seed=0)
    assert env.max_tool_calls_per_turn == 8 and env.turn_time_budget_s == 60.0
    code = make("areal_agents/CodeSandbox-v0", tool_timeout_s=4)
    assert code.turn_time_budget_s == 12.0  # three calls' worth
    code.close()
