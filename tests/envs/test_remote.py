"""RemoteEnv: a Gymnasium environment on an environment server behaves as the local one.

The fidelity test plays the same scripted actions (tool calls, broken calls, structured tool
calls, final answers) with fixed seeds against every built-in environment, locally and through
the server over HTTP and WebSocket, and compares the JSON bytes of every reset and step result.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from areal_agents.envs import Task, make_env, register_builtin_envs, resolve_env_id
from areal_agents.envs import remote as remote_module
from areal_agents.envs.remote import (
    ConnectionOptions,
    EnvServerError,
    RemoteEnv,
    RemoteEnvError,
    SessionLostError,
    parse_remote,
    register_remote,
)
from areal_agents.envs.serve import EnvServer
from areal_agents.errors import ConfigError, InfrastructureError, UnknownEnvironmentError
from areal_agents.files import read_jsonl
from areal_agents.policies import ScriptedPolicy
from areal_agents.rollout import run_episode
from areal_agents.types import Message, ToolCall, ToolSpec, Turn

ROOT = Path(__file__).resolve().parents[2]
register_builtin_envs()
FAST = {"retries": 2, "backoff_s": 0.01}  # the tests' servers answer or are gone for good


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def calculator_answer(obs: list[dict[str, Any]]) -> str:
    expression = re.search(r"What is (.+)\?", obs[-1]["content"]).group(1)  # type: ignore[union-attr]
    return f"The answer is \\boxed{{{eval(expression)}}}"  # digits and + - * only


Action = str | Turn | Callable[[list[dict[str, Any]]], str]
# env alias -> (keyword arguments of both environments, the scripted actions)
SCRIPTS: dict[str, tuple[dict[str, Any], list[Action]]] = {
    "calculator": (
        {},
        [
            call("calculator", expression="2 + 3 * 4"),
            call("calculator", expression="1 // 0"),  # a failing tool
            Turn("", tool_calls=(ToolCall("calculator", '{"expression": "7 * 6"}', "c1"),)),
            calculator_answer,  # correct: reward 1
        ],
    ),
    "code_sandbox": (
        {"sandbox_backend": "process"},
        [
            call("python", code="print(sum(range(10)))"),
            '<tool_call>{"name": "python", "arguments": ',  # unparseable
            Turn("", tool_calls=(ToolCall("python", '{"code": "print(1 / 0)"}'),)),
            "```python\ndef add(a, b):\n    return a + b\n```",
        ],
    ),
    "math_python": (
        {"sandbox_backend": "process"},
        [
            call("python", code="print(2 ** 10)"),
            call("no_such_tool"),  # unknown tool
            "The answer is \\boxed{1024}",
        ],
    ),
    "search": (
        {"kb_seed": 0},
        [
            call("search", query="born in"),
            call("search", wrong=1),  # invalid arguments
            "<answer>Vessa</answer>",
        ],
    ),
}


def play(env: gym.Env[Any, Any], seed: int, actions: list[Action]) -> list[bytes]:
    """JSON bytes of the reset and every step result until the episode ends."""
    first, info = env.reset(seed=seed)
    out = [json.dumps([first, info]).encode()]
    for action in actions:
        act = action(first) if callable(action) else action  # a callable reads the task
        result = env.step(act)
        out.append(json.dumps(result).encode())
        terminated, truncated = result[2], result[3]
        if terminated or truncated:
            break
    return out


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_remote_results_are_byte_identical_to_local_ones(name: str) -> None:
    kwargs, actions = SCRIPTS[name]
    local = make_env(name, **kwargs)
    expected = {seed: play(local, seed, actions) for seed in (0, 1, 2)}
    with EnvServer(name, env_kwargs=kwargs) as server:
        for url in (server.url, server.url.replace("http", "ws")):
            remote = make_env(f"remote:{url}/{name}")
            assert isinstance(remote.unwrapped, RemoteEnv)
            assert remote.observation_space == local.observation_space
            assert remote.action_space == local.action_space
            for seed, results in expected.items():
                assert len(results) > 2
                assert play(remote, seed, actions) == results, (name, url, seed)
            remote.close()
    local.close()
    if name == "calculator":  # the script's correct answer was scored the same both ways
        assert all(json.loads(results[-1])[1] == 1.0 for results in expected.values())


def test_check_env_passes_and_spaces_follow_the_kwargs() -> None:
    with EnvServer("calculator") as server:
        for url in (server.url, server.url.replace("http", "ws")):
            env = make_env(f"remote:{url}/calculator")
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                check_env(env.unwrapped)  # also makes it with render_mode="ansi" from its spec
            env.close()
        env = make_env(f"remote:{server.url}/areal_agents/Calculator-v0", max_turns=20)
        assert env.observation_space.max_messages == 84  # type: ignore[attr-defined]
        assert env.unwrapped.served_id == "areal_agents/Calculator-v0"  # type: ignore[attr-defined]
        env.close()
        with pytest.raises(UnknownEnvironmentError, match="serves 'calculator'"):
            RemoteEnv(server.url, "search")
        with pytest.raises(ConfigError, match="clients may not set 'num_operands'"):
            RemoteEnv(server.url, "calculator", num_operands=5)


def test_any_gymnasium_environment_numpy_observations_and_actions() -> None:
    with EnvServer("CartPole-v1") as server:
        local, remote = gym.make("CartPole-v1"), RemoteEnv(f"{server.url}/CartPole-v1")
        assert remote.observation_space == local.observation_space
        assert remote.action_space == local.action_space
        check_env(remote, skip_render_check=True)
        for env in (local, remote):
            env.action_space.seed(5)
        a, b = local.reset(seed=3), remote.reset(seed=3)
        assert a[0].dtype == b[0].dtype == np.float32 and np.array_equal(a[0], b[0])
        for _ in range(20):
            action = local.action_space.sample()
            assert remote.action_space.sample() == action
            sa, sb = local.step(action), remote.step(action)
            assert np.array_equal(sa[0], sb[0]) and sa[1:] == sb[1:]
            if sa[2] or sa[3]:
                break
        remote.close()


async def test_an_episode_over_the_server_matches_the_local_episode() -> None:
    """The rollout loop keeps the conversation the remote environment recorded (tool-call ids
    included), so transcripts and token-level training see the same messages as locally."""

    def script(conversation: list[Message], tools: list[ToolSpec]) -> str:
        if conversation[-1].role == "user":
            expression = re.search(r"What is (.+)\?", conversation[-1].content).group(1)  # type: ignore[union-attr]
            return call("calculator", expression=expression)
        return f"\\boxed{{{conversation[-1].content}}}"

    with EnvServer("calculator") as server:
        episodes = []
        for env in (make_env("calculator"), make_env(f"remote:{server.url}/calculator")):
            episodes.append(await run_episode(env, ScriptedPolicy(script), seed=7))
            env.close()
    local, remote = (e.to_json() | {"duration_s": 0} for e in episodes)
    assert remote == local and local["reward"] == 1.0
    assert local["messages"][2]["tool_calls"][0]["id"] == "call_1_0"  # recorded by the env


def test_a_server_that_is_down_is_an_infrastructure_fault() -> None:
    server = EnvServer("calculator").start()
    url = server.url
    env = RemoteEnv(url, "calculator", connection=FAST)
    env.reset(seed=0)
    server.stop()
    with pytest.raises(EnvServerError, match="failed after 3 attempt") as info:
        env.step(call("calculator", expression="1 + 1"))
    assert isinstance(info.value, InfrastructureError)
    with pytest.raises(EnvServerError):  # nobody listens there now
        RemoteEnv(f"remote:{url}/calculator?retries=1&backoff_s=0.01")
    env.close()  # closing against a dead server is quiet


async def test_the_rollout_drops_an_episode_whose_server_died_instead_of_scoring_it() -> None:
    server = EnvServer("calculator").start()
    env = make_env(f"remote:{server.url}/calculator?retries=1&backoff_s=0.01")
    turns = 0

    def script(conversation: list[Message], tools: list[ToolSpec]) -> str:
        nonlocal turns
        turns += 1
        if turns == 2:
            server.stop()  # the server goes away in the middle of the episode
        return call("calculator", expression="1 + 1")

    with pytest.raises(InfrastructureError):
        await run_episode(env, ScriptedPolicy(script), seed=0)
    assert turns == 2
    env.close()


def losing_first_step_answer(real: Callable[..., Any], lost: list[str]) -> Callable[..., Any]:
    """A transport ``call`` whose first step reaches the server but whose answer is lost."""

    def flaky(self: Any, op: str, body: dict[str, Any]) -> Any:
        answer = real(self, op, body)  # the server applied it ...
        if op == "step" and not lost:
            lost.append(body["request_id"])
            raise remote_module._TransportError("connection reset")  # ... the answer is lost
        return answer

    return flaky


def test_a_lost_answer_is_retried_without_applying_the_step_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with EnvServer("calculator") as server:
        for url in (server.url, server.url.replace("http", "ws")):
            env = RemoteEnv(url, "calculator", connection=FAST)
            env.reset(seed=0)
            transport = env._transport
            lost: list[str] = []
            flaky = losing_first_step_answer(type(transport).call, lost)
            monkeypatch.setattr(type(transport), "call", flaky)
            before = server.manager.steps
            obs, _, _, _, info = env.step(call("calculator", expression="6*7"))
            assert lost and obs[0]["content"] == "42" and info["turn"] == 1
            assert server.manager.steps == before + 1  # applied once, answered twice
            assert env.step("\\boxed{1}")[4]["turn"] == 2
            monkeypatch.undo()
            env.close()


def test_an_idle_session_is_reopened_by_reset_and_lost_to_step() -> None:
    with EnvServer("calculator", idle_timeout_s=0.3) as server:
        env = RemoteEnv(server.url, "calculator", connection=FAST)
        env.reset(seed=0)
        first = env.session_id
        while server.manager.health()["sessions"]:
            time.sleep(0.05)
        with pytest.raises(SessionLostError, match="without a request"):
            env.step("\\boxed{1}")
        obs, _ = env.reset(seed=0)  # a new episode needs nothing from the old session
        assert env.session_id != first and obs[-1]["role"] == "user"
        env.close()


def test_errors_of_the_remote_environment_surface_as_they_would_locally() -> None:
    with EnvServer("calculator") as server:
        env = RemoteEnv(server.url, "calculator")
        with pytest.raises(gym.error.ResetNeeded):
            env.step("x")  # no session yet
        env.reset(seed=0)
        obs, reward, terminated, _, info = env.step(5)  # a model mistake, as locally
        assert (reward, terminated) == (0.0, False) and info["tool_errors"]["parse"] == 1
        assert "the action must be text" in obs[-1]["content"]
        env.step("\\boxed{0}")
        with pytest.raises(gym.error.ResetNeeded, match="episode is over"):
            env.step("again")
        with pytest.raises(ConfigError, match="cannot select tasks by id"):
            env.reset(options={"task_id": "nope"})
        env.close()
        env.close()  # twice is fine
    with EnvServer("test_remote/Buggy-v0") as server:
        env = RemoteEnv(server.url)
        env.reset(seed=0)
        with pytest.raises(RemoteEnvError, match="invalid literal for int"):
            env.step("anything")  # not an action of Discrete(2): a 400 with the reason
        with pytest.raises(RemoteEnvError, match="500 EnvironmentError: ZeroDivisionError"):
            env.step(1)  # the environment's own bug
        env.close()


def test_a_task_given_in_the_options_reaches_the_server_as_it_reaches_the_local_env() -> None:
    task = Task(id="t1", prompt="What is 2 + 2?", answer=4, metadata={"expression": "2 + 2"})
    with EnvServer("calculator") as server:
        local, remote = make_env("calculator"), RemoteEnv(server.url, "calculator")
        for options in ({"task": task}, {"task": {"id": "t2", "prompt": "5?", "answer": 5}}):
            assert json.dumps(remote.reset(options=options)) == json.dumps(
                local.reset(options=options)
            )
            assert remote.step("\\boxed{4}")[1] == local.step("\\boxed{4}")[1]
        remote.close()


def counting(real: Callable[..., Any], calls: list[str]) -> Callable[..., Any]:
    """A transport ``call`` that notes each operation it sends."""

    def call(self: Any, op: str, body: dict[str, Any]) -> Any:
        calls.append(op)
        return real(self, op, body)

    return call


def test_a_step_that_outlasts_the_timeout_fails_at_once_without_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with EnvServer("test_remote/Slow-v0") as server:
        options = {"timeout_s": 0.3, "retries": 5, "backoff_s": 0.01}
        for url in (server.url, server.url.replace("http", "ws")):
            env = RemoteEnv(url, connection=options)
            env.reset(seed=0)
            calls: list[str] = []
            monkeypatch.setattr(
                type(env._transport), "call", counting(type(env._transport).call, calls)
            )
            with pytest.raises(EnvServerError, match=r"no answer within 0\.3 s"):
                env.step(1)  # the environment takes 1 s: a retry would only wait for it again
            assert calls == ["step"]
            monkeypatch.undo()
            env.close()


class SlowEnv(gym.Env[int, int]):
    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: Any) -> Any:
        time.sleep(1.0)
        return 1, 1.0, True, False, {}


class BuggyEnv(gym.Env[int, int]):
    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: Any) -> Any:
        return 1 // 0


for _id, _env in (("test_remote/Buggy-v0", BuggyEnv), ("test_remote/Slow-v0", SlowEnv)):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_env)


def test_remote_names_parse_and_register() -> None:
    url, env_id, options = parse_remote("remote:ws://127.0.0.1:9/acme_m:acme/X-v0?timeout_s=5")
    assert (url, env_id, options.timeout_s) == ("ws://127.0.0.1:9", "acme_m:acme/X-v0", 5.0)
    gym_id = resolve_env_id("remote:http://127.0.0.1:9/calculator?retries=0")
    assert gym_id == register_remote("remote:http://127.0.0.1:9/calculator?retries=0")
    assert gym.spec(gym_id).kwargs["connection"] == ConnectionOptions(retries=0)
    other = register_remote("remote:http://127.0.0.1:9/calculator")  # same slug, other options
    assert other != gym_id and other.startswith("remote/")
    with pytest.raises(ConfigError, match="remote:http://HOST:PORT/ENV_ID"):
        parse_remote("remote:127.0.0.1:9/calculator")
    with pytest.raises(ConfigError, match="unknown remote option 'timeout'"):
        parse_remote("remote:http://127.0.0.1:9/calculator?timeout=5")
    with pytest.raises(ConfigError, match="positive"):
        ConnectionOptions(timeout_s=0)
    with pytest.raises(ConfigError, match=r"unknown connection options \['timeout'\]"):
        RemoteEnv("http://127.0.0.1:9", connection={"timeout": 1})


# ---- the trainer against a served environment -------------------------------------------


@pytest.fixture
def served_calculator(tmp_path: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_agents.envs.serve", "env=calculator", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("serving "):
                yield line.split("env=")[1].split(")")[0]  # remote:http://127.0.0.1:PORT/...
                break
        else:
            raise AssertionError("the environment server did not start")
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0  # drained and closed cleanly


@pytest.mark.integration
def test_train_two_steps_of_the_tiny_model_against_a_served_environment(
    served_calculator: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = [
        f"env={served_calculator}",
        "env.max_turns=2",  # a kwarg the server lets clients set
        "model=tiny",
        "env.group_size=2",
        "trainer.groups_per_step=2",
        "trainer.total_steps=2",
        "inference.max_tokens=8",
        "log.progress=false",
        "log.tensorboard=false",
        "ray.num_cpus=2",
        "eval.held_out_tasks=0",
        f"output_dir={out}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "areal_agents.train", *args],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl", torn_ok=True)
    assert [r["step"] for r in rows] == [1, 2] and all(r["episodes"] == 4 for r in rows)
    transcripts = read_jsonl(out / "transcripts.jsonl", torn_ok=True)
    assert transcripts and all(t["task_id"].startswith("calc-") for t in transcripts)
    assert transcripts[0]["messages"][0]["role"] == "system"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_version"] == 2 and summary["env"] == served_calculator
    page = (out / "report.html").read_text()  # the run's page, refreshed at the last step
    data = json.loads(page.split('id="run-data">')[1].split("</script>")[0])
    assert data["finished"] and [r["step"] for r in data["metrics"]] == [1, 2]
    assert all("tools/error_rate" in r and "time/train_s" in r for r in data["metrics"])
    host, port = parse_remote(served_calculator)[0].removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/health")
    stats = json.loads(conn.getresponse().read())
    assert stats["steps"] >= 8 and stats["sessions_opened"] >= 2  # it played every step
    assert stats["sessions"] == 0  # the workers closed their sessions when the run ended


@pytest.mark.integration
def test_eval_scores_a_served_environment_as_it_scores_the_local_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a strict fake OpenAI endpoint, which rejects a tool message that answers no
    tool call: the conversation a remote episode sends must be the local one."""
    from areal_agents.eval import main
    from tests.policies.fake_openai import FakeOpenAI
    from tests.test_eval import CalculatorAgent

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("AREAL_API_KEY", raising=False)
    outcomes = []
    with EnvServer("calculator") as env_server:
        for env in ("calculator", f"remote:{env_server.url.replace('http', 'ws')}/calculator"):
            with FakeOpenAI(CalculatorAgent()).running() as fake:
                out = tmp_path / str(len(outcomes))
                summary = main(
                    [f"env={env}", f"policy.base_url={fake.base_url}", "policy.model=scripted",
                     f"output_dir={out}", "progress=false", "num_episodes=6",
                     "samples_per_task=2", "concurrency=3"]
                )  # fmt: skip
            records = read_jsonl(
                out / "transcripts.jsonl", torn_ok=True
            )  # which sample of a task answers
            # first (and right) depends on timing: compare the episodes as a set
            outcomes.append(
                (summary, sorted((r["reward"], json.dumps(r["messages"])) for r in records))
            )
    (local, local_records), (remote, remote_records) = outcomes
    assert remote["episodes_dropped"] == 0 and remote["mean_reward"] == local["mean_reward"] == 0.5
    for key in ("pass@1", "pass@2", "tool_errors", "turns_per_episode", "tool_calls_per_episode"):
        assert remote[key] == local[key], key
    assert remote_records == local_records
