"""The environment server: sessions, limits, idle timeout, request ids, bad requests, WebSocket,
the command line and its drain on SIGTERM.

Most tests run the server in a thread of the test process (``EnvServer``) and talk raw HTTP or
WebSocket to it, as a client in another language would; the command-line tests start the real
``python -m areal_agents.envs.serve`` process.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from websockets.sync.client import connect

from areal_agents.envs import register_builtin_envs
from areal_agents.envs.base import MultiTurnEnv, Score, Task
from areal_agents.envs.serve import EnvServer
from areal_agents.envs.serve import main as serve_main
from areal_agents.envs.sessions import SessionManager
from areal_agents.errors import ConfigError, UnknownEnvironmentError

ROOT = Path(__file__).resolve().parents[2]
register_builtin_envs()
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


class TrapEnv(MultiTurnEnv):
    """Echo tasks whose step misbehaves on request: blocks on a gate, raises, or exits."""

    gate = threading.Event()

    def sample_task(self, rng: Any) -> Task:
        return Task(id=f"t{int(rng.integers(1000))}", prompt="say something", answer="ok")

    def score(self, task: Task, submission: str, turn: Any) -> Score:
        if submission == "crash":
            raise ZeroDivisionError("the environment has a bug")
        if submission == "exit":
            raise SystemExit(3)
        if submission == "wait":
            assert TrapEnv.gate.wait(30), "the test never opened the gate"
        return Score(float(submission == task.answer))


if "test_serve/Trap-v0" not in gym.registry:
    gym.register(id="test_serve/Trap-v0", entry_point=TrapEnv)


class Client:
    """Raw JSON over one keep-alive HTTP connection."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def post(self, op: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else json.dumps(body or {}).encode()
        self.conn.request("POST", f"/{op}", body=data)
        response = self.conn.getresponse()
        return response.status, json.loads(response.read())

    def get(self, route: str) -> tuple[int, Any]:
        self.conn.request("GET", route)
        response = self.conn.getresponse()
        return response.status, json.loads(response.read())


@pytest.fixture
def calc() -> Iterator[EnvServer]:
    # a full server refuses (503) rather than close a session used in the last 30 s
    with EnvServer("calculator", max_sessions=4, evict_idle_s=30) as server:
        yield server


def test_reset_opens_isolated_sessions_and_step_close_take_the_id(calc: EnvServer) -> None:
    client = Client(calc.url)
    status, a = client.post("reset", {"seed": 1})
    assert status == 200 and a["observation"][-1]["role"] == "user"
    assert a["observation_space"] == {"type": "MessagesSpace", "max_messages": 64}
    _, b = client.post("reset", {"seed": 2, "kwargs": {"max_turns": 1}})
    assert a["session_id"] != b["session_id"] and len(a["session_id"]) >= 20
    assert a["info"]["task_id"] != b["info"]["task_id"]
    # interleaved steps: each session moves only its own environment
    _, sa = client.post("step", {"session_id": a["session_id"], "action": CALL})
    assert sa["observation"][0]["content"] == "42" and sa["info"]["turn"] == 1
    assert not sa["truncated"] and sa["assistant"]["tool_calls"][0]["id"] == "call_1_0"
    _, sb = client.post("step", {"session_id": b["session_id"], "action": CALL})
    assert sb["info"]["turn"] == 1 and sb["truncated"]  # max_turns=1 held in b only
    _, sa2 = client.post("step", {"session_id": a["session_id"], "action": "\\boxed{3}"})
    assert sa2["info"]["turn"] == 2 and sa2["terminated"]
    # a second reset of a session starts a new episode in the same environment
    _, again = client.post("reset", {"session_id": a["session_id"], "seed": 1})
    assert again["session_id"] == a["session_id"] and again["observation"] == a["observation"]
    health = client.get("/health")[1]
    assert health["sessions"] == 2 and health["steps"] == 3 and health["status"] == "ok"
    assert client.post("close", {"session_id": a["session_id"]}) == (200, {"closed": True})
    assert client.post("close", {"session_id": a["session_id"]}) == (200, {"closed": False})
    status, gone = client.post("step", {"session_id": a["session_id"], "action": "x"})
    assert status == 404 and "closed by the client" in gone["error"]["message"]
    assert client.get("/health")[1]["sessions"] == 1


def test_bad_requests_get_a_4xx_with_a_message(calc: EnvServer) -> None:
    client = Client(calc.url)
    _, ok = client.post("reset", {"seed": 0})
    sid = ok["session_id"]

    def error(op: str, body: Any = None, raw: bytes | None = None) -> tuple[int, str, str]:
        status, answer = client.post(op, body, raw)
        return status, answer["error"]["type"], answer["error"]["message"]

    assert error("step", raw=b"{not json")[:2] == (400, "BadRequest")
    assert error("step", raw=b"[1, 2]")[2] == "the body must be a JSON object"
    assert error("step", {"session_id": sid})[2] == "a step needs 'action'"
    assert error("step", {"session_id": "nope", "action": "x"})[:2] == (404, "UnknownSession")
    assert error("step", {"session_id": 7, "action": "x"})[0] == 400
    status, answer = client.post("step", {"session_id": sid, "action": 5})
    assert status == 200 and answer["info"]["tool_errors"]["parse"] == 1  # a model mistake
    assert error("step", {"session_id": sid, "action": "x", "action_kind": "turn"})[0] == 400
    assert error("reset", {"seed": "zero"})[:2] == (400, "BadRequest")
    assert error("reset", {"options": [1]})[0] == 400
    status, kind, message = error("reset", {"env_id": "search"})
    assert (status, kind) == (404, "UnknownEnvironment") and "serves 'calculator'" in message
    status, kind, message = error("reset", {"kwargs": {"num_operands": 9}})
    assert (status, kind) == (403, "KwargNotAllowed") and "--client-kwargs num_operands" in message
    status, kind, message = error("reset", {"seed": 0, "options": {"task_id": "x"}})
    assert (status, kind) == (422, "ConfigError") and "cannot select tasks by id" in message
    client.post("step", {"session_id": sid, "action": "\\boxed{1}"})
    status, kind, message = error("step", {"session_id": sid, "action": "again"})
    assert (status, kind) == (409, "ResetNeeded") and "reset()" in message
    assert client.post("spaces", {"env_id": "areal_agents/Calculator-v0"})[0] == 200
    # none of it hurt the session or the server
    assert client.post("reset", {"session_id": sid, "seed": 0})[0] == 200
    health = client.get("/health")[1]
    assert health["status"] == "ok" and health["sessions"] == 1  # failed openings left none


def test_an_environment_that_raises_or_exits_fails_only_its_own_request() -> None:
    with EnvServer("test_serve/Trap-v0") as server:
        client = Client(server.url)
        sids = [client.post("reset", {"seed": i})[1]["session_id"] for i in range(3)]
        status, crash = client.post("step", {"session_id": sids[0], "action": "crash"})
        assert status == 500 and crash["error"]["type"] == "EnvironmentError"
        assert "ZeroDivisionError: the environment has a bug" in crash["error"]["message"]
        status, exited = client.post("step", {"session_id": sids[1], "action": "exit"})
        assert status == 500 and "SystemExit" in exited["error"]["message"]
        status, fine = client.post("step", {"session_id": sids[2], "action": "ok"})
        assert status == 200 and fine["reward"] == 1.0 and fine["terminated"]


def test_steps_run_off_the_event_loop_and_a_retried_request_is_applied_once() -> None:
    TrapEnv.gate.clear()
    with EnvServer("test_serve/Trap-v0") as server:
        client = Client(server.url)
        slow = client.post("reset", {"seed": 0})[1]["session_id"]
        answers: list[Any] = []

        def blocked_step() -> None:
            body = {"session_id": slow, "action": "wait", "request_id": "r1"}
            answers.append(Client(server.url).post("step", body))

        first = threading.Thread(target=blocked_step)
        first.start()
        deadline = time.monotonic() + 10
        while server.manager.in_flight == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # while that step blocks in its thread, the server answers everything else
        retry = threading.Thread(target=blocked_step)  # the same request id: no second step
        retry.start()
        assert client.get("/health")[1]["in_flight"] >= 1
        other = client.post("reset", {"seed": 1})[1]["session_id"]
        assert client.post("step", {"session_id": other, "action": "ok"})[1]["reward"] == 1.0
        assert not answers
        TrapEnv.gate.set()
        first.join(10)
        retry.join(10)
        assert [a[0] for a in answers] == [200, 200] and answers[0][1] == answers[1][1]
        assert server.manager.steps == 2  # the blocked step once, the other session's once
        status, again = client.post("step", {"session_id": slow, "action": "wait"})
        assert status == 409 and again["error"]["type"] == "ResetNeeded"


def test_session_limit_and_idle_timeout() -> None:
    with EnvServer("calculator", max_sessions=2, idle_timeout_s=0.4, evict_idle_s=30) as server:
        client = Client(server.url)
        first = client.post("reset", {"seed": 0})[1]["session_id"]
        client.post("reset", {"seed": 1})
        status, full = client.post("reset", {"seed": 2})
        assert status == 503 and full["error"]["type"] == "TooManySessions"
        assert "--max-sessions" in full["error"]["message"]
        deadline = time.monotonic() + 10
        while client.get("/health")[1]["sessions"]:
            assert time.monotonic() < deadline, "idle sessions were never closed"
            time.sleep(0.1)
        status, gone = client.post("step", {"session_id": first, "action": "x"})
        assert status == 404 and "without a request" in gone["error"]["message"]
        assert client.post("reset", {"seed": 2})[0] == 200  # room again


def test_websocket_step_loop_and_pipelined_requests(calc: EnvServer) -> None:
    with connect(calc.url.replace("http", "ws") + "/ws") as ws:

        def ask(**message: Any) -> Any:
            ws.send(json.dumps(message))
            return json.loads(ws.recv(timeout=30))

        opened = ask(op="reset", id=1, seed=3)
        assert opened["id"] == 1 and opened["status"] == 200
        sid = opened["result"]["session_id"]
        stepped = ask(op="step", id=2, session_id=sid, action=CALL, request_id="a")
        assert stepped["result"]["observation"][0]["content"] == "42"
        assert ask(op="nope", id=3)["status"] == 400
        ws.send("not json")
        assert json.loads(ws.recv(timeout=30))["status"] == 400
        # several sessions in flight on one connection; answers carry their ids
        for i in range(4):
            ws.send(json.dumps({"op": "reset", "id": 10 + i, "seed": i}))
        replies = [json.loads(ws.recv(timeout=30)) for _ in range(4)]
        assert sorted(r["id"] for r in replies) == [10, 11, 12, 13]
        # four sessions at most: one of the five opened is refused
        assert sorted(r["status"] for r in replies) == [200, 200, 200, 503]
        assert ask(op="step", id=20, session_id=sid, action=CALL, request_id="a") == {
            **stepped,
            "id": 20,
        }  # a retry by request id: the first answer, not a second step


def test_manager_rejects_bad_configuration() -> None:
    with pytest.raises(UnknownEnvironmentError, match="cannot serve"):
        SessionManager("acme/Missing-v0")
    with pytest.raises(ConfigError, match="max_sessions"):
        SessionManager("calculator", max_sessions=0)


# ---- the command line ---------------------------------------------------------------------


SLOW_MODULE = """
import time
import gymnasium as gym
from areal_agents.envs.base import MultiTurnEnv, Score, Task

class SlowEnv(MultiTurnEnv):
    def sample_task(self, rng):
        return Task(id="slow", prompt="wait for it", answer="done")

    def score(self, task, submission, turn):
        time.sleep(float(submission))
        return Score(1.0, {"slept": float(submission)})

gym.register(id="acme/Slow-v0", entry_point=SlowEnv)
"""


def start_cli(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    (tmp_path / "acme_slow.py").write_text(textwrap.dedent(SLOW_MODULE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_agents.envs.serve", *args, "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # the server prints where it listens once it does
        seen.append(line)
        if line.startswith("serving "):
            return proc, line.split(" at ")[1].split()[0]
    raise AssertionError("the server never said where it listens:\n" + "".join(seen))


@pytest.mark.integration
def test_cli_serves_a_user_module_and_drains_in_flight_steps_on_sigterm(tmp_path: Path) -> None:
    proc, url = start_cli(tmp_path, "env=acme_slow:acme/Slow-v0", "max_turns=3")
    stack = contextlib.ExitStack()
    try:
        assert url.startswith("http://127.0.0.1:")
        client = Client(url)
        health = client.get("/health")[1]
        assert health["env_id"] == "acme/Slow-v0" and health["status"] == "ok"
        sid = client.post("reset", {"seed": 0})[1]["session_id"]
        result: list[Any] = []
        step = threading.Thread(
            target=lambda: result.append(
                Client(url).post("step", {"session_id": sid, "action": "1.5"})
            )
        )
        ws = stack.enter_context(connect(url.replace("http", "ws") + "/ws"))
        ws.send(json.dumps({"op": "reset", "id": 1, "seed": 1}))
        ws_sid = json.loads(ws.recv(timeout=30))["result"]["session_id"]
        step.start()
        ws.send(json.dumps({"op": "step", "id": 2, "session_id": ws_sid, "action": "1.5"}))
        time.sleep(0.5)  # both steps are sleeping in their environments now
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = Client(url)
        try:  # new work is refused while the drain runs (or the socket is already closed)
            status, refused = late.post("reset", {"seed": 1})
            assert status == 503 and refused["error"]["type"] == "ServerDraining"
        except (ConnectionError, http.client.HTTPException):
            pass
        step.join(30)
        assert result and result[0][0] == 200, result
        assert result[0][1]["reward"] == 1.0 and result[0][1]["info"]["reward_details"] == {
            "slept": 1.5
        }
        over_ws = json.loads(ws.recv(timeout=30))  # the WebSocket's step is answered too
        assert over_ws["id"] == 2 and over_ws["status"] == 200 and over_ws["result"]["terminated"]
        assert proc.wait(timeout=30) == 0
    finally:
        stack.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_rejects_a_missing_or_unknown_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        serve_main(["env=no_such_env", "--port", "0"])
    assert exit_.value.code == 2 and "unknown environment 'no_such_env'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        serve_main(["max_turns=3"])
    assert exit_.value.code == 2 and "env=ID" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        serve_main(["env=calculator", "max_turns"])
    assert exit_.value.code == 2 and "KEY=VALUE" in capsys.readouterr().err
