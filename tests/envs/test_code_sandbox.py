"""CodeSandbox-v0: episodes with scripted policies, task sources, and HumanEval's canonical
solutions scored through the environment in the Docker sandbox."""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from areal_agents.envs import CodeSandboxEnv, make_env
from areal_agents.envs.tasks import humaneval_tasks
from areal_agents.errors import ConfigError, SandboxError
from areal_agents.policies import ScriptedPolicy
from areal_agents.rollout import run_episode
from areal_agents.types import Message, ToolSpec

BROKEN = """

_original = {ep}


def {ep}(*args, **kwargs):
    result = _original(*args, **kwargs)
    if isinstance(result, bool):
        return not result
    if isinstance(result, (int, float)):
        return result + 1
    if isinstance(result, str):
        return result + "x"
    if isinstance(result, (list, tuple)):
        return type(result)(list(result) + [None])
    return 0
"""


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def env_for(**kwargs: object) -> CodeSandboxEnv:
    kwargs.setdefault("sandbox_backend", "process")
    return CodeSandboxEnv(**kwargs)  # type: ignore[arg-type]


# ---- episodes with scripted policies -----------------------------------------------------


async def test_solver_that_tests_its_code_then_answers_reaches_one() -> None:
    env = env_for()

    def script(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        solution = env.task.metadata["canonical_solution"]  # type: ignore[union-attr]
        tests = env.task.metadata["tests"]  # type: ignore[union-attr]
        if conversation[-1].role == "user":  # first turn: try the solution with one test
            return "Let me check. " + call(
                "python", code=solution + "\n" + tests[0] + "\nprint('ok')"
            )
        assert "exit code 0" in conversation[-1].content and "ok" in conversation[-1].content
        return "It works:\n" + fenced(solution)

    episode = await run_episode(env, ScriptedPolicy(script), seed=3)
    assert (episode.reward, episode.terminated, episode.truncated) == (1.0, True, False)
    assert episode.num_turns == 2 and episode.tool_calls == 1
    assert episode.info["reward_details"]["status"] == "correct"
    assert episode.task_id.startswith("gen/")
    env.close()


async def test_wrong_solver_gets_zero() -> None:
    env = env_for()

    def script(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        name = env.task.metadata["entry_point"]  # type: ignore[union-attr]
        return fenced(f"def {name}(*args):\n    return None")

    episode = await run_episode(env, ScriptedPolicy(script), seed=4)
    assert episode.reward == 0.0 and episode.terminated
    assert episode.info["reward_details"]["status"] == "wrong"
    env.close()


async def test_bad_tool_calls_are_shown_to_the_model_and_counted() -> None:
    env = env_for(max_turns=6)
    bad_turns = [
        call("python", cmd="print(1)"),  # wrong argument name
        call("shell", command="ls"),  # no such tool
        '<tool_call>{"name": "python", "arguments": {"code": "print(1)"</tool_call>',  # bad JSON
        call("python", code="def f(:\n  pass"),  # runs, but is not Python
    ]
    # the first turn sees the task; each later turn sees what the previous call caused
    turns = iter([*bad_turns, "I give up."])
    observed: list[str] = []

    def script(conversation: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        observed.append(conversation[-1].content)
        return next(turns)

    episode = await run_episode(env, ScriptedPolicy(script), seed=5)
    assert "missing required argument 'code'" in observed[1]
    assert "unknown tool 'shell'" in observed[2] and "python" in observed[2]
    assert "could not parse tool call" in observed[3]
    assert "SyntaxError" in observed[4] and observed[4].startswith("exit code 1")
    assert dict(episode.tool_errors) == {
        "parse": 1,
        "unknown_tool": 1,
        "invalid_arguments": 1,
        "tool_failure": 0,
        "timeout": 0,
        "too_many_calls": 0,
        "time_budget": 0,
    }
    assert episode.reward == 0.0 and episode.info["reward_details"]["status"] == "no_answer"
    env.close()


async def test_running_out_of_turns_truncates_with_zero() -> None:
    env = env_for(max_turns=3)
    policy = ScriptedPolicy(lambda conv, tools: call("python", code="print('still thinking')"))
    episode = await run_episode(env, policy, seed=6)
    assert (episode.reward, episode.terminated, episode.truncated) == (0.0, False, True)
    assert episode.num_turns == 3 and episode.info["outcome"] == "max_turns"
    env.close()


def test_submit_tool_is_a_submission() -> None:
    env = env_for()
    env.reset(options={"task_id": "gen/reverse/11"})
    code = "def reverse_string(s):\n    return s[::-1]"
    obs, reward, terminated, _, _ = env.step(call("submit", code=code))
    assert (reward, terminated, obs) == (1.0, True, [])
    env.reset(options={"task_id": "gen/reverse/11"})
    assert env.step(call("submit", code="   "))[4]["reward_details"]["status"] == "no_answer"
    env.close()


def test_bash_tool_can_be_enabled() -> None:
    env = env_for(tools=("python", "bash"))
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["python", "bash"]
    obs = env.step(call("bash", command="echo hi"))[0]
    assert obs[0]["content"] == "exit code 0\nstdout:\nhi"
    env.close()
    with pytest.raises(ConfigError, match="unknown code tool"):
        env_for(tools=("pyhton",))


def test_timeouts_in_hidden_tests_are_reported_as_timeouts() -> None:
    env = env_for(case_timeout_s=0.3)
    env.reset(options={"task_id": "gen/add/1"})
    info = env.step(fenced("def add(a, b):\n    while True:\n        pass"))[4]
    assert info["reward_details"]["status"] == "timeout"
    env.close()


def test_fraction_reward_mode() -> None:
    env = env_for(reward_mode="fraction")
    env.reset(options={"task_id": "gen/max_list/5"})
    reward, info = env.step(fenced("def max_of_list(xs):\n    return xs[0]"))[1::3]
    details = info["reward_details"]
    assert 0.0 <= reward < 1.0 and reward == pytest.approx(details["passed"] / details["total"])
    env.close()


# ---- tasks, determinism, resources -------------------------------------------------------


def test_reset_is_deterministic_and_names_the_task() -> None:
    env = env_for()
    obs1, info1 = env.reset(seed=42)
    obs2, info2 = env.reset(seed=42)
    assert obs1 == obs2 and info1["task_id"] == info2["task_id"]
    tasks = {env.reset(seed=s)[1]["task_id"] for s in range(10)}
    assert len(tasks) > 5  # different seeds, different tasks
    env.close()


def test_humaneval_task_selected_by_id() -> None:
    env = env_for(source="humaneval")
    obs, info = env.reset(options={"task_id": "HumanEval/0"})
    assert info["task_id"] == "HumanEval/0"
    assert "def has_close_elements" in obs[-1]["content"]
    assert len(humaneval_tasks()) == 164
    with pytest.raises(ConfigError, match="HumanEval/00"):
        env.reset(options={"task_id": "HumanEval/00"})
    env.close()
    default = env_for()  # procedural by default, yet HumanEval ids still select their task
    assert default.reset(options={"task_id": "HumanEval/7"})[1]["task_id"] == "HumanEval/7"
    with pytest.raises(ConfigError, match="gen/<template>/<seed>"):
        default.reset(options={"task_id": "MBPP/1"})
    default.close()


def test_user_jsonl_tasks(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"prompt": "Write double(x).", "tests": ["assert double(2) == 4"], "entry_point": "double"},
        {"id": "t2", "prompt": "Write triple(x).", "tests": "assert triple(3) == 9\n"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = env_for(source="jsonl", path=str(path))
    env.reset(options={"task_id": "tasks/0"})
    assert env.step(fenced("def double(x):\n    return 2 * x"))[1] == 1.0
    env.reset(options={"task_id": "t2"})
    assert env.step(fenced("def triple(x):\n    return x * 3"))[1] == 1.0
    env.close()
    path.write_text('{"prompt": "no tests"}\n')
    with pytest.raises(ConfigError, match="missing key"):
        env_for(source="jsonl", path=str(path))


def test_task_given_as_a_row_in_options() -> None:
    env = env_for()
    row = {
        "id": "inline",
        "prompt": "Write sq(x).",
        "tests": ["assert sq(3) == 9"],
        "entry_point": "sq",
    }
    env.reset(options={"task": row})
    assert env.step(fenced("def sq(x):\n    return x * x"))[1] == 1.0
    env.close()


def test_close_and_garbage_collection_release_the_sandbox() -> None:
    env = env_for()
    env.reset(seed=0)
    env.step(call("python", code="print(1)"))
    sandbox = env.sandbox.get()
    env.close()
    with pytest.raises(SandboxError):
        sandbox.run("true")
    env2 = env_for()
    env2.reset(seed=0)
    env2.step(call("python", code="print(1)"))
    sandbox2 = env2.sandbox.get()
    del env2
    gc.collect()
    with pytest.raises(SandboxError):
        sandbox2.run("true")


def test_bad_configuration_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match="humaneval"):
        env_for(source="humaneavl")
    with pytest.raises(ConfigError, match="path"):
        env_for(source="jsonl")
    with pytest.raises(ConfigError, match="sandbox_backend"):
        CodeSandboxEnv(sandbox_backend="podman")
    with pytest.raises(ConfigError, match="unknown code template"):
        env_for(templates=("addd",))


def test_alias_makes_the_registered_env() -> None:
    env = make_env("code_sandbox", sandbox_backend="process")
    assert isinstance(env.unwrapped, CodeSandboxEnv)
    env.close()


# ---- Docker: check_env and HumanEval -----------------------------------------------------


@pytest.mark.docker
@pytest.mark.parametrize("source", ["procedural", "humaneval"])
def test_check_env_in_docker(source: str) -> None:
    env = gym.make("areal_agents/CodeSandbox-v0", sandbox_backend="docker", source=source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped)
    finally:
        env.close()


def _score_humaneval(ids: Sequence[str], broken: bool) -> dict[str, dict[str, object]]:
    env = CodeSandboxEnv(source="humaneval", sandbox_backend="docker")
    out = {}
    try:
        for task_id in ids:
            env.reset(options={"task_id": task_id})
            meta = env.task.metadata  # type: ignore[union-attr]
            code = meta["canonical_solution"]
            if broken:
                code += BROKEN.format(ep=meta["entry_point"])
            _, reward, terminated, _, info = env.step("Solution:\n" + fenced(code))
            assert terminated
            out[task_id] = {"reward": reward, **info["reward_details"]}
    finally:
        env.close()
    return out


SUBSET = [f"HumanEval/{i}" for i in range(0, 164, 8)] + ["HumanEval/32", "HumanEval/163"]


@pytest.mark.docker
@pytest.mark.integration
def test_humaneval_canonical_solutions_score_one_and_broken_ones_zero_in_docker() -> None:
    good = _score_humaneval(SUBSET, broken=False)
    assert {k: v for k, v in good.items() if v["reward"] != 1.0} == {}
    bad = _score_humaneval(SUBSET, broken=True)
    assert {k: v for k, v in bad.items() if v["reward"] != 0.0 or v["status"] != "wrong"} == {}


@pytest.mark.docker
@pytest.mark.slow
def test_all_164_humaneval_canonical_solutions_score_one_in_docker() -> None:
    good = _score_humaneval(humaneval_tasks().ids, broken=False)
    assert len(good) == 164
    assert {k: v for k, v in good.items() if v["reward"] != 1.0} == {}
