"""The environment server against hostile clients (issue 28, items 2 and 5; red team round 3:
``e1_envserver.py``, ``e2_rce.py``, ``e4_surrogate_remote.py``), ported here with small limits
so that each attack takes well under a second or two.

Each test checks one property: a client's task cannot carry code the host runs; every route
needs the key when there is one; bodies, heads and WebSocket messages are limited while they
arrive; idle sessions cannot lock other clients out; malformed requests are 4xx answers; a
request id cannot fetch another request's result; any text in a reply is escaped.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from areal_agents.envs import make_env, register_builtin_envs
from areal_agents.envs.base import MultiTurnEnv, Score, Task
from areal_agents.envs.remote import RemoteEnv
from areal_agents.envs.serve import WS_MAX_PENDING, EnvServer
from areal_agents.envs.wire import API_KEY_ENV
from areal_agents.errors import ConfigError
from tests.envs._serve_client import address as server_address
from tests.envs._serve_client import closed_by_server, post

register_builtin_envs()
KEY = "k3y-for-the-tests"
WRONG = "```python\ndef add(a, b):\n    raise ValueError('\\ud800 nope')\n```"  # e4's answer


class Hostile(MultiTurnEnv):
    """Steps that block on a gate, or answer with a lone surrogate in their info."""

    gate = threading.Event()

    def sample_task(self, rng: Any) -> Task:
        return Task(id="t", prompt="say something", answer="ok")

    def score(self, task: Task, submission: str, turn: Any) -> Score:
        if submission == "wait":
            assert Hostile.gate.wait(30), "the test never opened the gate"
        return Score(0.0, {"message": "bad \ud800 text", submission: "\udfff"})


if "test_serve_hostile/Hostile-v0" not in gym.registry:
    gym.register(id="test_serve_hostile/Hostile-v0", entry_point=Hostile)


@pytest.fixture
def calc() -> Iterator[EnvServer]:
    with EnvServer("calculator", max_sessions=8) as server:
        yield server


# ---- H2: no code from clients (e2_rce.py) ------------------------------------------------------


@pytest.fixture(scope="module")
def code_server() -> Iterator[EnvServer]:
    with EnvServer("code_sandbox", env_kwargs={"sandbox_backend": "process"}) as server:
        yield server


def _proof_tests(proof: Path) -> str:
    return f"open({str(proof)!r}, 'w').write('ran on the host')\nassert add(1, 2) == 3\n"


@pytest.mark.parametrize("key", ["tests", "test", "preamble", "prompt_code", "entry"])
def test_a_clients_task_that_carries_code_is_refused(
    code_server: EnvServer, tmp_path: Path, key: str
) -> None:
    proof = tmp_path / "proof"
    code = _proof_tests(proof)
    task: dict[str, Any] = {"prompt": "write add", "entry_point": "add", "tests": ["assert 1"]}
    task[key] = code if key != "entry" else {"source_dataset": "countdown", "code": code}
    if key != "tests":
        task.pop("tests")
    status, answer = post(code_server.url, "reset", {"options": {"task": task}})
    assert status == 403 and answer["error"]["type"] == "TaskNotAllowed"
    assert (
        key in answer["error"]["message"] and "--trust-client-tasks" in answer["error"]["message"]
    )
    # nor on a session already open, nor over the WebSocket
    status, opened = post(code_server.url, "reset", {"options": {"task_id": "gen/add/7"}})
    assert status == 200
    body = {"session_id": opened["session_id"], "options": {"task": task}}
    assert post(code_server.url, "reset", body)[0] == 403
    with connect(code_server.url.replace("http", "ws") + "/ws") as ws:
        ws.send(json.dumps({"op": "reset", "id": 1, "options": {"task": task}}))
        assert json.loads(ws.recv(timeout=30))["status"] == 403
    post(code_server.url, "close", {"session_id": opened["session_id"]})
    assert not proof.exists()


def test_remote_env_says_a_code_task_is_a_configuration_error(code_server: EnvServer) -> None:
    for url in (code_server.url, code_server.url.replace("http", "ws")):
        env = RemoteEnv(url, "code_sandbox", connection={"retries": 0})
        task = {"prompt": "p", "tests": "assert add(1, 1) == 2", "entry_point": "add"}
        with pytest.raises(ConfigError, match="runs no client's code"):
            env.reset(options={"task": task})
        env.close()


def test_trust_client_tasks_is_what_lets_a_client_task_run() -> None:
    """The flag changes the outcome: the same task is graded by its own tests when trusted."""
    task = {"prompt": "write add", "tests": ["assert add(1, 2) == 3"], "entry_point": "add"}
    answer = "```python\ndef add(a, b):\n    return a + b\n```"
    kwargs = {"sandbox_backend": "process"}
    for trusted in (False, True):
        with EnvServer("code_sandbox", env_kwargs=kwargs, trust_client_tasks=trusted) as server:
            status, opened = post(server.url, "reset", {"options": {"task": task}})
            assert status == (200 if trusted else 403)
            if trusted:
                body = {"session_id": opened["session_id"], "action": answer}
                status, stepped = post(server.url, "step", body)
                assert status == 200 and stepped["reward"] == 1.0, stepped["info"]


def test_a_task_without_code_is_still_accepted(calc: EnvServer) -> None:
    task = {"id": "mine", "prompt": "What is 2 + 2?", "answer": 4, "notes": "plain data"}
    status, opened = post(calc.url, "reset", {"options": {"task": task}})
    assert status == 200 and opened["info"]["task_id"] == "mine"


# ---- the API key (e1 basic: unauth_other_local_user; new: bypass attempts) ---------------------


def test_every_route_needs_the_key_and_health_shows_only_its_status() -> None:
    with EnvServer("calculator", api_key=KEY) as server:
        url = server.url
        for op in ("reset", "step", "spaces", "render", "close", "nope"):
            status, answer = post(url, op, {"seed": 1})
            assert status == 401 and answer["error"]["type"] == "Unauthorized", op
        for headers in (
            {"Authorization": KEY},  # no scheme
            {"Authorization": f"bearer{KEY}"},
            {"Authorization": f"Bearer {KEY[:-1]}"},  # a prefix
            {"Authorization": f"Bearer {KEY}x"},
            {"Authorization": f"Bearer  {KEY}"},
            {"X-Api-Key": KEY},
        ):
            assert post(url, "reset", {}, headers=headers)[0] == 401, headers
        conn = http.client.HTTPConnection(*server_address(url), timeout=30)
        tricks = [("POST", "//reset"), ("POST", "/reset/"), ("GET", "/reset"), ("POST", "/health")]
        for method, path in [*tricks, ("HEAD", "/health/"), ("OPTIONS", "/reset")]:
            conn.request(method, path, body=b"{}")
            response = conn.getresponse()
            response.read()
            assert response.status == 401, (method, path)
            conn.close()
        conn.request("GET", "/health")
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
        # a key in the query string is not a key
        with pytest.raises(InvalidStatus) as refused:
            connect(url.replace("http", "ws") + f"/ws?api_key={KEY}").close()
        assert refused.value.response.status_code == 403
        with connect(
            url.replace("http", "ws") + "/ws", additional_headers={"Authorization": f"Bearer {KEY}"}
        ) as ws:
            ws.send(json.dumps({"op": "reset", "id": 1}))
            assert json.loads(ws.recv(timeout=30))["status"] == 200
        auth = {"Authorization": f"Bearer {KEY}"}
        status, health = 0, {}
        conn.request("GET", "/health", headers=auth)
        response = conn.getresponse()
        status, health = response.status, json.loads(response.read())
        assert status == 200 and health["sessions"] == 1  # the full body for key holders
        assert post(url, "reset", {}, headers=auth)[0] == 200


def test_the_key_from_the_environment_keys_the_server_and_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with EnvServer("calculator") as server:
        assert post(server.url, "reset", {})[0] == 401
        for url in (server.url, server.url.replace("http", "ws")):
            env = make_env(f"remote:{url}/calculator")  # reads the key from the environment
            obs, _ = env.reset(seed=0)
            assert obs[-1]["role"] == "user"
            env.close()
            with pytest.raises(ConfigError, match=API_KEY_ENV):
                RemoteEnv(url, "calculator", api_key="wrong", connection={"retries": 3})


# ---- bodies, heads, connections (e1 big, slow, ws) ---------------------------------------------


def test_a_body_past_the_limit_is_refused_while_it_streams() -> None:
    """M4: a 1.2 GB body was read whole before the 64 MB limit. With a 64 KB limit, the
    server refuses a declared size at once and a chunked one once 64 KB have arrived: the
    client manages to send little of what it tries to."""
    limit = 64 << 10
    with EnvServer("calculator", max_request_bytes=limit) as server:
        head = b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        with socket.create_connection(server_address(server.url), timeout=10) as sock:
            sock.sendall(head + b"Content-Length: 1258291200\r\n\r\n")  # 1.2 GB declared
            assert sock.recv(65536).startswith(b"HTTP/1.1 413")
            assert closed_by_server(sock, 5)
        chunk = b"%x\r\n%s\r\n" % (1 << 16, b"a" * (1 << 16))
        sent, total = 0, 128 << 20
        with socket.create_connection(server_address(server.url), timeout=10) as sock:
            sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
                while sent < total:
                    sock.sendall(chunk)
                    sent += 1 << 16
            assert sent < 32 << 20, f"the server read {sent >> 20} MB past a 64 KB limit"
        assert post(server.url, "reset", {})[0] == 200


def test_half_open_and_trickling_connections_are_closed() -> None:
    """M4: 3000 connections with unfinished heads were all still open after 30 s."""
    with EnvServer("calculator", request_timeout_s=0.5, keep_alive_s=1.0) as server:
        address = server_address(server.url)
        partial = []
        for _ in range(20):
            sock = socket.create_connection(address, timeout=5)
            sock.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
            partial.append(sock)
        silent = socket.create_connection(address, timeout=5)  # says nothing at all
        body = socket.create_connection(address, timeout=5)  # a head, then a trickled body
        body.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        start = time.monotonic()
        assert post(server.url, "reset", {})[0] == 200  # others are served meanwhile
        assert all(closed_by_server(s, 3) for s in [*partial, silent])
        assert time.monotonic() - start < 5
        body.settimeout(3)
        assert body.recv(65536).startswith(b"HTTP/1.1 408")
        # a kept-alive connection that goes quiet is closed after keep_alive_s
        conn = http.client.HTTPConnection(*address, timeout=5)
        conn.request("POST", "/spaces", body=b"{}")
        conn.getresponse().read()
        assert conn.sock is not None and closed_by_server(conn.sock, 4)
        for sock in [*partial, silent, body]:
            sock.close()


def test_a_websocket_message_past_the_limit_closes_only_that_socket() -> None:
    with EnvServer("calculator", max_request_bytes=64 << 10) as server:
        ws_url = server.url.replace("http", "ws") + "/ws"
        with connect(ws_url, max_size=None) as ws:
            ws.send("x" * (1 << 20))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        with connect(ws_url) as ws:
            ws.send(json.dumps({"op": "reset", "id": 1}))
            assert json.loads(ws.recv(timeout=30))["status"] == 200


def test_a_websocket_runs_a_bounded_number_of_requests_at_once() -> None:
    """A client that pipelines thousands of messages gets them read as earlier ones finish."""
    Hostile.gate.clear()
    with EnvServer("test_serve_hostile/Hostile-v0") as server:
        with connect(server.url.replace("http", "ws") + "/ws") as ws:
            ws.send(json.dumps({"op": "reset", "id": 0}))
            sid = json.loads(ws.recv(timeout=30))["result"]["session_id"]
            for i in range(3 * WS_MAX_PENDING):
                ws.send(
                    json.dumps({"op": "step", "id": i + 1, "session_id": sid, "action": "wait"})
                )
            time.sleep(0.5)
            assert 1 <= server.manager.in_flight <= WS_MAX_PENDING
            Hostile.gate.set()
            statuses = [
                json.loads(ws.recv(timeout=30))["status"] for _ in range(3 * WS_MAX_PENDING)
            ]
        assert statuses.count(200) == 1 and set(statuses) == {200, 409}  # one step, then over


# ---- sessions (e1 sessions, request ids) -------------------------------------------------------


def test_idle_sessions_make_room_oldest_first() -> None:
    """M4: 256 idle sessions locked every other client out for up to 600 s."""
    with EnvServer("calculator", max_sessions=3, evict_idle_s=0.3) as server:
        sids = [post(server.url, "reset", {"seed": i})[1]["session_id"] for i in range(3)]
        status, full = post(server.url, "reset", {})
        assert status == 503 and "--evict-idle-s" in full["error"]["message"]  # none idle yet
        time.sleep(0.4)
        assert post(server.url, "render", {"session_id": sids[0]})[0] == 200  # used again
        assert post(server.url, "reset", {})[0] == 200
        status, gone = post(server.url, "step", {"session_id": sids[1], "action": "x"})
        assert status == 404 and "to make room" in gone["error"]["message"]  # the oldest idle
        for sid in (sids[0], sids[2]):
            assert post(server.url, "render", {"session_id": sid})[0] == 200
        assert server.manager.health()["sessions_evicted"] == 1


def test_a_client_holding_every_session_locks_nobody_out() -> None:
    """e1's sessions_300_held: with the defaults, a client that had just opened every session
    (none idle for long) made the next client's reset a 503 until they had idled 30 s."""
    with EnvServer("calculator", max_sessions=8) as server:
        held = [post(server.url, "reset", {})[1]["session_id"] for _ in range(12)]
        status, mine = post(server.url, "reset", {"seed": 1})
        assert status == 200, mine
        step = {"session_id": mine["session_id"], "action": "<answer>1</answer>"}
        assert post(server.url, "step", step)[0] == 200
        status, gone = post(server.url, "step", {"session_id": held[4], "action": "x"})
        assert status == 404 and "to make room" in gone["error"]["message"]  # oldest first
        assert post(server.url, "render", {"session_id": held[-1]})[0] == 200
        assert server.manager.health()["sessions_evicted"] == 5


def test_a_busy_session_is_not_evicted() -> None:
    Hostile.gate.clear()
    with EnvServer("test_serve_hostile/Hostile-v0", max_sessions=1, evict_idle_s=0.0) as server:
        sid = post(server.url, "reset", {})[1]["session_id"]
        step = threading.Thread(
            target=post, args=(server.url, "step", {"session_id": sid, "action": "wait"})
        )
        step.start()
        while server.manager.in_flight == 0:
            time.sleep(0.01)
        assert post(server.url, "reset", {})[0] == 503
        Hostile.gate.set()
        step.join(30)
        assert post(server.url, "reset", {})[0] == 200  # idle now: it makes room


def test_a_reused_request_id_cannot_fetch_another_request(calc: EnvServer) -> None:
    """Low (e1): B reusing A's opening request id got A's session."""
    status, a = post(calc.url, "reset", {"request_id": "fixed-id-1"})
    assert status == 200
    body = {"request_id": "fixed-id-1", "kwargs": {"max_turns": 9}}
    status, b = post(calc.url, "reset", body)
    assert status == 409 and b["error"]["type"] == "RequestIdReused"
    assert a["session_id"] not in json.dumps(b)
    # a true retry (the same request) still gets the first answer
    assert post(calc.url, "reset", {"request_id": "fixed-id-1"})[1] == a
    step = {"session_id": a["session_id"], "action": "\\boxed{1}", "request_id": "s1"}
    status, first = post(calc.url, "step", step)
    assert status == 200
    assert post(calc.url, "step", {**step, "action": "\\boxed{2}"})[0] == 409
    assert post(calc.url, "step", step)[1] == first


def _running(marker: str) -> list[str]:
    """The pids of processes whose command line holds ``marker``."""
    pids = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                pids.append(proc.name)
    return pids


def test_clients_that_leave_mid_step_leave_a_usable_session_and_no_process() -> None:
    """e1's sandbox phase: clients give up on steps whose tool calls sleep; a session answers
    its next step once the first ends, a close waits for the step under way, and no tool call
    outlives the tool's time limit (2 s here: the others would sleep 50 s)."""
    marker = f"left-behind-{time.monotonic_ns()}"
    kwargs = {"sandbox_backend": "process", "tool_timeout_s": 2}

    def sleep(seconds: int) -> str:
        code = f"import time  # {marker}\ntime.sleep({seconds})"
        return (
            f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"
        )

    with EnvServer("code_sandbox", env_kwargs=kwargs) as server:
        task = {"options": {"task_id": "gen/add/7"}}
        sids = [post(server.url, "reset", task)[1]["session_id"] for _ in range(4)]
        for i, sid in enumerate(sids):
            conn = http.client.HTTPConnection(*server_address(server.url), timeout=0.3)
            with contextlib.suppress(TimeoutError):
                body = {"session_id": sid, "action": sleep(1 if i == 0 else 50)}
                conn.request("POST", "/step", body=json.dumps(body))
                conn.getresponse()
            conn.close()
        assert _running(marker), "the tool calls never started"
        code = "```python\ndef add(a, b):\n    return a + b\n```"
        status, stepped = post(server.url, "step", {"session_id": sids[0], "action": code})
        assert status == 200 and stepped["reward"] == 1.0, stepped
        for sid in sids:
            assert post(server.url, "close", {"session_id": sid})[0] == 200
        deadline = time.monotonic() + 5
        while _running(marker):
            assert time.monotonic() < deadline, f"still running: {_running(marker)}"
            time.sleep(0.1)


# ---- malformed requests (e1 basic low items; new: numbers, text) -------------------------------


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("deep_json", b'{"session_id":"x","action":' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
        ("deep_options", b'{"options":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}"),
        ("seed_5000_digits", b'{"seed":' + b"9" * 5000 + b"}"),
        ("seed_2_200", b'{"seed":' + str(2**200).encode() + b"}"),
        ("seed_negative", b'{"seed":-1}'),
        ("seed_float", b'{"seed":1.5}'),
        ("seed_nan", b'{"seed":NaN}'),
        ("bad_utf8", b'{"a":"\xff\xfe"}'),
        ("not_object", b"[1,2,3]"),
        ("content_length_lie", b""),
    ],
)
def test_malformed_requests_are_answered_4xx(calc: EnvServer, name: str, raw: bytes) -> None:
    if name == "content_length_lie":
        with socket.create_connection(server_address(calc.url), timeout=10) as sock:
            sock.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 400")
        return
    status, answer = post(calc.url, "reset", raw=raw)
    assert 400 <= status < 500 and answer["error"]["type"] == "BadRequest", answer
    assert post(calc.url, "reset", {"seed": 1})[0] == 200


def test_a_deep_websocket_frame_is_answered_and_the_socket_lives(calc: EnvServer) -> None:
    """Low (e1): a deep frame closed the WebSocket without a close frame."""
    with connect(calc.url.replace("http", "ws") + "/ws", max_size=None) as ws:
        ws.send("[" * 100_000 + "]" * 100_000)
        assert json.loads(ws.recv(timeout=10))["status"] == 400
        ws.send('{"op": "reset", "id": 2, "seed": ' + "9" * 5000 + "}")
        assert json.loads(ws.recv(timeout=10))["status"] == 400
        ws.send(json.dumps({"op": "reset", "id": 9}))
        assert json.loads(ws.recv(timeout=10))["status"] == 200


def test_surrogates_in_request_fields_come_back_escaped(calc: EnvServer) -> None:
    """New: every error message that quotes a field still writes valid JSON."""
    for op, raw in [
        ("step", b'{"session_id":"\\ud800","action":"x"}'),
        ("reset", b'{"env_id":"\\udfff"}'),
        ("reset", b'{"kwargs":{"\\ud800":1}}'),
        ("reset", b'{"options":{"task":{"prompt":"\\ud800","answer":"\\udc00"}}}'),
        ("reset", b'{"options":{"task_id":"\\ud800"}}'),
    ]:
        status, answer = post(calc.url, op, raw=raw)
        assert status < 500, (raw, answer)


# ---- M1: replies survive any text (e4_surrogate_remote.py) -------------------------------------


def test_a_reply_holding_lone_surrogates_is_sent_escaped() -> None:
    with EnvServer("test_serve_hostile/Hostile-v0") as server:
        sid = post(server.url, "reset", {})[1]["session_id"]
        status, stepped = post(server.url, "step", {"session_id": sid, "action": "x"})
        assert status == 200 and stepped["info"]["reward_details"]["message"] == "bad \ud800 text"
        with connect(server.url.replace("http", "ws") + "/ws") as ws:
            ws.send(json.dumps({"op": "reset", "id": 1}))
            wsid = json.loads(ws.recv(timeout=30))["result"]["session_id"]
            ws.send(json.dumps({"op": "step", "id": 2, "session_id": wsid, "action": "y"}))
            reply = json.loads(ws.recv(timeout=30))
        assert reply["status"] == 200 and reply["result"]["info"]["reward_details"]["y"] == "\udfff"


def test_a_wrong_answer_whose_error_holds_a_surrogate_scores_0_remotely(
    code_server: EnvServer,
) -> None:
    """e4: the grader's message carried the surrogate; the server answered 500 over HTTP (the
    episode was dropped as an infrastructure fault) and nothing over WebSocket."""
    for url in (code_server.url, code_server.url.replace("http", "ws")):
        env = make_env(f"remote:{url}/code_sandbox?timeout_s=60&retries=0")
        env.reset(options={"task_id": "gen/add/7"})
        _, reward, terminated, _, info = env.step(WRONG)
        assert reward == 0.0 and terminated, info
        env.close()
