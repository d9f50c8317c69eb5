"""The built-in inference server against hostile clients (issue 28, item 3; red team round 3:
``i1_inference.py``), on the tiny model with small limits so that each attack is cheap.

Each test checks one property: with a key, every route but ``/health`` needs it; a request too
big to serve is refused before it is tokenised or queued; malformed fields are 400s in OpenAI's
shape; any text echoed back is escaped. The vLLM launcher's key middleware and the clients that
must send the key are checked here too.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from areal_agents.errors import WeightSyncError
from areal_agents.net import free_port
from areal_agents.serving.auth import SERVER_API_KEY_ENV

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_MODEL_LEN = 256
MAX_BYTES = 1 << 20


class Served:
    """The real application on the tiny model, served by uvicorn in a thread; ``submitted``
    counts generations the engine was given and ``encoded`` texts the tokenizer was given."""

    def __init__(self) -> None:
        import uvicorn

        from areal_agents.serving.api import create_app
        from areal_agents.serving.engine import Engine
        from areal_agents.trainers.modeling import tiny_model_path

        self.engine = Engine(tiny_model_path(), max_batch_size=4, max_model_len=MAX_MODEL_LEN)
        self.submitted = 0
        self.encoded = 0
        submit, tok = self.engine.submit, self.engine.tokenizer
        encode, template = tok.encode, tok.apply_chat_template

        def counting_submit(request: Any) -> Any:
            self.submitted += 1
            return submit(request)

        def counting_encode(*args: Any, **kwargs: Any) -> Any:
            self.encoded += 1
            return encode(*args, **kwargs)

        def counting_template(*args: Any, **kwargs: Any) -> Any:
            self.encoded += 1
            return template(*args, **kwargs)

        self.engine.submit = counting_submit  # type: ignore[method-assign]
        tok.encode = counting_encode
        tok.apply_chat_template = counting_template
        app = create_app(
            self.engine, "tiny", api_key=KEY, max_request_bytes=MAX_BYTES, max_request_sequences=8
        )
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    server = Served()
    yield server
    server.close()


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }


def legit(served: Served) -> None:
    response = httpx.post(
        f"{served.url}/v1/chat/completions", json=chat(), headers=AUTH, timeout=60
    )
    assert response.status_code == 200, response.text


# ---- H3: every route behind the key --------------------------------------------------------------


def test_every_route_but_health_needs_the_key(served: Served) -> None:
    routes = [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/weight_version"),
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/update_weights_from_disk"),
        ("POST", "/update_weights?version=5"),
        ("POST", "//v1/chat/completions"),  # path tricks (red team: double slash)
        ("POST", "/v1/chat/completions/"),
        ("POST", "/PAUSE"),
        ("HEAD", "/weight_version"),
        ("OPTIONS", "/pause"),
        ("POST", "/health"),
        ("GET", "/nope"),
    ]
    bad_keys: list[dict[str, str]] = [
        {},
        {"Authorization": KEY},
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": f"Bearer {KEY[:-1]}"},
        {"Authorization": f"bearer{KEY}"},
        {"X-Api-Key": KEY},
    ]
    with httpx.Client(base_url=served.url, timeout=30) as client:
        for method, path in routes:
            for headers in bad_keys:
                response = client.request(method, path, content=b"\x00" * 100, headers=headers)
                assert response.status_code == 401, (method, path, headers, response.text)
        assert not served.engine.is_paused  # the unauthenticated /pause did nothing
        assert client.get("/health").status_code == 200
        assert client.get("/weight_version", headers=AUTH).status_code == 200
    legit(served)


def test_the_training_client_sends_the_key(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    from areal_agents.serving.server import BuiltinServerClient

    with pytest.raises(WeightSyncError, match="401"):
        BuiltinServerClient(served.url + "/v1", api_key="wrong").pause(timeout=10)
    client = BuiltinServerClient(served.url + "/v1", api_key=KEY)
    assert client.weight_version() == served.engine.weight_version
    client.pause(timeout=30)
    assert served.engine.is_paused
    client.resume()
    monkeypatch.setenv(SERVER_API_KEY_ENV, KEY)  # the key from the environment
    assert BuiltinServerClient(served.url).weight_version() == served.engine.weight_version
    legit(served)


def test_the_launcher_hands_the_key_to_the_child_through_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from areal_agents.serving.server import BuiltinServer

    monkeypatch.delenv(SERVER_API_KEY_ENV, raising=False)
    server = BuiltinServer(api_key=KEY)
    assert server.environment()[SERVER_API_KEY_ENV] == KEY
    assert KEY not in " ".join(server.command())  # never on the command line
    monkeypatch.setenv(SERVER_API_KEY_ENV, "inherited")
    assert BuiltinServer().environment()[SERVER_API_KEY_ENV] == "inherited"
    assert BuiltinServer().api_key == "inherited"


# ---- M5: sizes checked before tokenising or queueing --------------------------------------------


@pytest.mark.parametrize(
    ("name", "body", "status"),
    [
        ("2000_prompts_x_n_64", {"model": "tiny", "prompt": [[1, 2, 3]] * 2000, "n": 64}, 400),
        ("string_prompts_x_9", {"model": "tiny", "prompt": ["hello world"] * 9}, 400),
        ("n_9_of_one_prompt", {"model": "tiny", "prompt": "hello", "n": 9}, 400),
        ("n_65", {"model": "tiny", "prompt": "hello", "n": 65}, 400),
        ("long_string_prompt", {"model": "tiny", "prompt": "w" * (MAX_MODEL_LEN * 81 + 1)}, 400),
        ("body_over_the_limit", {"model": "tiny", "prompt": "word " * (MAX_BYTES // 4)}, 413),
        ("100k_string_prompts", {"model": "tiny", "prompt": ["hello world"] * 100_000}, 413),
    ],
)
def test_a_request_too_big_is_refused_before_it_costs_anything(
    served: Served, name: str, body: dict[str, Any], status: int
) -> None:
    encoded, submitted = served.encoded, served.submitted
    start = time.monotonic()
    response = httpx.post(f"{served.url}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == status
    assert time.monotonic() - start < 5
    assert (served.encoded, served.submitted) == (encoded, submitted)  # not tokenised, queued
    legit(served)


def test_a_long_chat_is_refused_by_its_characters_before_the_template_runs(served: Served) -> None:
    encoded = served.encoded
    content = "word " * (MAX_MODEL_LEN * 81 // 5 + 1)
    body = chat(messages=[{"role": "user", "content": content}])
    response = httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert response.status_code == 400 and "maximum context length" in response.text
    assert served.encoded == encoded
    many = chat(messages=[{"role": "user", "content": "a"}] * 10_000, n=1)
    response = httpx.post(f"{served.url}/v1/chat/completions", json=many, headers=AUTH, timeout=60)
    assert response.status_code == 400  # 10k messages: rendered, then too long for the context


def test_a_streamed_body_past_the_limit_is_refused_while_it_arrives(served: Served) -> None:
    """M5: a 100 MB prompt was read, parsed and tokenised before its length was checked."""
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Type: application/json\r\n"
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + b"Content-Length: 104857600\r\n\r\n")  # 100 MB declared
        assert sock.recv(65536).startswith(b"HTTP/1.1 413")
    chunk = b"%x\r\n%s\r\n" % (1 << 16, b"a" * (1 << 16))
    sent, total = 0, 128 << 20
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
            while sent < total:
                sock.sendall(chunk)
                sent += 1 << 16
    assert sent < 32 << 20, f"the server read {sent >> 20} MB past a 1 MB limit"
    legit(served)


# ---- low items and new attacks: malformed fields are 400s, echoed text is escaped ---------------


def _chat_raw(*messages: dict[str, Any]) -> bytes:
    return json.dumps(chat(messages=list(messages))).encode()


USER = {"role": "user", "content": "x"}
DEEP_SCHEMA = b'{"type":"object","properties":{"a":' * 3000 + b"{}" + b"}}" * 3000
MALFORMED: dict[str, tuple[str, bytes]] = {
    "seed_5000_digits": (
        "completions",
        b'{"model":"tiny","prompt":"hi","seed":%s}' % (b"9" * 5000),
    ),
    "seed_2_70": ("completions", b'{"model":"tiny","prompt":"hi","seed":%d}' % 2**70),
    "stop_token_ids_2_70": (
        "completions",
        b'{"model":"tiny","prompt":"hi","max_tokens":2,"stop_token_ids":[%d]}' % 2**70,
    ),
    "stop_token_id_negative": (
        "chat/completions",
        json.dumps(chat(stop_token_ids=[-1])).encode(),
    ),
    "stop_token_id_past_the_vocabulary": (
        "completions",
        b'{"model":"tiny","prompt":"hi","max_tokens":2,"stop_token_ids":[1000000000]}',
    ),
    "content_parts_garbage": (
        "chat/completions",
        _chat_raw({"role": "user", "content": [1, None, {"text": 5}]}),
    ),
    "content_part_image": (
        "chat/completions",
        _chat_raw({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
    ),
    "tool_calls_string": (
        "chat/completions",
        _chat_raw(USER, {"role": "assistant", "content": None, "tool_calls": "abc"}),
    ),
    "tool_call_function_null": (
        "chat/completions",
        _chat_raw(USER, {"role": "assistant", "tool_calls": [{"function": None}]}),
    ),
    "prompt_lone_surrogate": ("completions", b'{"model":"tiny","prompt":"hi \\ud800"}'),
    "chat_lone_surrogate": (
        "chat/completions",
        b'{"model":"tiny","messages":[{"role":"user","content":"\\udfff"}]}',
    ),
    "deep_json": (
        "chat/completions",
        b'{"model":"tiny","messages":%s}' % (b"[" * 100_000 + b"]" * 100_000),
    ),
    "deep_tool_schema": (
        "chat/completions",
        b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",'
        b'"function":{"name":"f","parameters":%s}}]}' % DEEP_SCHEMA,
    ),
    "not_json": ("completions", b"\xff\xfe garbage"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_requests_are_openai_shaped_400s(served: Served, name: str) -> None:
    route, raw = MALFORMED[name]
    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(f"{served.url}/v1/{route}", content=raw, headers=headers, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == 400


def test_echoed_text_with_lone_surrogates_is_escaped(served: Served) -> None:
    """New: a model name or stop string is echoed back; a lone surrogate in it made a 500."""
    headers = {**AUTH, "Content-Type": "application/json"}
    url = f"{served.url}/v1/completions"
    response = httpx.post(url, content=b'{"model":"\\ud800","prompt":"hi"}', headers=headers)
    assert response.status_code == 404 and "\ud800" in response.json()["error"]["message"]
    for stream in ("false", "true"):
        raw = b'{"model":"tiny","prompt":"hi","max_tokens":2,"stream":%s,"stop":["\\ud800"]}'
        response = httpx.post(url, content=raw % stream.encode(), headers=headers, timeout=60)
        assert response.status_code == 200, response.text


# ---- vLLM, as the project launches it ---------------------------------------------------------


def test_the_vllm_key_middleware_guards_every_route() -> None:
    import asyncio

    from areal_agents.serving.version_headers import ApiKeyMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def call(middleware: Any, method: str, path: str, headers: Any) -> int:
        transport = httpx.ASGITransport(app=middleware)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.request(method, path, headers=headers)).status_code

    guarded = ApiKeyMiddleware(app, api_key=KEY)
    for path in ("/pause", "/collective_rpc", "/update_weights", "/v1/models", "//v1/models"):
        for method in ("GET", "POST"):
            assert asyncio.run(call(guarded, method, path, {})) == 401, (method, path)
            assert asyncio.run(call(guarded, method, path, AUTH)) == 200
    assert asyncio.run(call(guarded, "GET", "/health", {})) == 200
    assert asyncio.run(call(ApiKeyMiddleware(app, api_key=""), "POST", "/pause", {})) == 200


def test_the_vllm_launcher_keys_every_route_and_its_own_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from areal_agents.serving import vllm
    from areal_agents.serving.vllm import KEY_MIDDLEWARE, VLLMServer
    from areal_agents.trainers.modeling import tiny_model_path

    monkeypatch.delenv(SERVER_API_KEY_ENV, raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    plain = VLLMServer(str(tiny_model_path()), python="python3")
    assert KEY_MIDDLEWARE not in plain.command() and "VLLM_API_KEY" not in plain.environment()
    server = VLLMServer(
        str(tiny_model_path()), python="python3", extra_args=["--api-key", KEY, "--seed", "1"]
    )
    command = server.command()
    assert KEY not in command and "--seed" in command  # moved off the command line
    assert command[command.index(KEY_MIDDLEWARE) - 1] == "--middleware"
    assert server.environment()["VLLM_API_KEY"] == KEY
    sent: list[Any] = []

    def fake_send(method: str, root: str, route: str, timeout: float, **kwargs: Any) -> Any:
        sent.append(kwargs.get("headers"))
        return httpx.Response(200, json={})

    monkeypatch.setattr(vllm, "send_request", fake_send)
    server.resume()
    assert sent == [AUTH]
