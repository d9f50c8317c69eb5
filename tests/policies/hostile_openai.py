"""A misbehaving OpenAI-compatible endpoint on 127.0.0.1, one mode per misbehaviour, for tests.

What it is: a standard-library HTTP server (``http.server``; no FastAPI, which would refuse to
send most of these bodies) whose ``/v1/chat/completions`` answers according to ``mode``. The
modes are grouped by what a correct client must make of them:

* :data:`MALFORMED` — a 200 whose body is not a well-formed reply (invalid JSON, text/plain,
  ``message: null``, content an int or a list, tool-call arguments as an object, null usage
  fields, a lone surrogate, deep nesting, no choices, a body over the size limit, ...): a
  retried, then counted, ``MalformedResponseError``;
* :data:`BROKEN` — transport and status failures (a body trickled one byte a second, no answer
  at all, a slow answer, 500, 429, 503 with HTML, 400, a cut body, a reset connection, bytes
  that are not HTTP): a retried (400: not retried), then counted, ``EndpointError``;
* :data:`BAD_TOOL_CALLS` — the model's malformed tool call (``function.name`` null, empty or a
  number, ``tool_calls`` a string or an object, an entry that is not an object or has no
  function) on the first turn of each episode, a correct answer after it: the episode goes on
  and is won, and the malformed call is counted;
* :data:`DEEP_IN_TEXT` — well-formed replies whose tool call nests 100 000 brackets deep
  inside text (the arguments string, a ``<tool_call>`` block), for the environment to refuse;
* ``good`` answers every calculator question correctly; ``flaky`` answers each request with
  an invalid body the first time it sees it, correctly when it is retried.

Sleeping modes wait on an event that :meth:`HostileOpenAI.running` sets on exit, so no handler
thread outlives the test.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from areal_agents.envs.calculator import safe_eval

__all__ = ["BAD_TOOL_CALLS", "BROKEN", "DEEP_IN_TEXT", "MALFORMED", "HostileOpenAI"]


def completion(content: Any = "", tool_calls: Any = None, **extra: Any) -> dict[str, Any]:
    """A well-formed chat completion; ``extra`` replaces top-level fields (``usage=...``)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "x",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    body.update(extra)
    return body


def answer(request: dict[str, Any]) -> str:
    """The right final answer to the calculator task in ``request``."""
    question = next(m["content"] for m in request["messages"] if m["role"] == "user")
    match = re.search(r"What is (.*)\?", question)
    value = safe_eval(match.group(1)) if match else 0
    return f"The answer is \\boxed{{{value}}}."


def _call(name: Any, arguments: Any = '{"expression": "1+1"}', call_id: Any = "c1") -> Any:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


_DEEP = 100_000

#: mode -> the body of a 200 reply (bytes as they are sent; dicts as JSON).
MALFORMED: dict[str, bytes | dict[str, Any]] = {
    "invalid_json": b'{"id": "x", "choices": [ {not json',
    "text_plain": b"The answer is \\boxed{4}",
    "empty_body": b"",
    "json_array": b"[]",
    "json_string": b'"The answer is 4"',
    "non_utf8": b'{"choices": [{"message": {"content": "\xff\xfe\xfa"}}]}',
    "random_bytes": bytes(range(256)) * 4,
    "message_null": {"choices": [{"index": 0, "message": None, "finish_reason": "stop"}]},
    "message_string": {"choices": [{"index": 0, "message": "4", "finish_reason": "stop"}]},
    "content_int": completion(12345),
    "content_list": completion([{"type": "text", "text": "\\boxed{1}"}]),
    "content_object": completion({"text": "\\boxed{1}"}),
    "tool_arguments_object": completion(None, [_call("calculator", {"expression": "1+1"})]),
    "tool_arguments_number": completion(None, [_call("calculator", 7)]),
    "tool_id_number": completion(None, [_call("calculator", call_id=17)]),
    "usage_null_fields": completion("\\boxed{1}", usage={"prompt_tokens": None}),
    "usage_string": completion("\\boxed{1}", usage="lots"),
    "usage_negative": completion("\\boxed{1}", usage={"prompt_tokens": -1, "completion_tokens": 5}),
    "usage_nan": b'{"choices": [{"message": {"content": "x"}}], '
    b'"usage": {"prompt_tokens": NaN, "completion_tokens": 1}}',
    "lone_surrogate": b'{"choices": [{"message": {"content": "bad \\ud800 \\\\boxed{1}"}}]}',
    "surrogate_in_arguments": b'{"choices": [{"message": {"tool_calls": [{"id": "c1", '
    b'"function": {"name": "calculator", "arguments": "{\\"e\\": \\"\\udc00\\"}"}}]}}]}',
    "deeply_nested_body": b'{"choices": ' + b"[" * _DEEP + b"]" * _DEEP + b"}",
    "deeply_nested_tool_call": b'{"choices": [{"message": {"tool_calls": '
    + b"[" * _DEEP
    + b"]" * _DEEP
    + b"}}]}",
    "missing_choices": {"id": "x", "object": "chat.completion", "model": "x"},
    "empty_choices": {"id": "x", "object": "chat.completion", "choices": []},
    "choices_null": {"id": "x", "object": "chat.completion", "choices": None},
    "choices_string": {"id": "x", "choices": "4"},
    "choice_not_object": {"id": "x", "choices": [4]},
    "finish_reason_number": {"choices": [{"message": {"content": "4"}, "finish_reason": 1}]},
    "error_in_200": {"error": {"message": "model overloaded", "type": "server_error"}},
    "non_openai": {"result": {"text": "The answer is 4"}, "status": "ok"},
    "oversized": completion("x" * (2 << 20)),  # over the 1 MB limit the tests set
}

#: mode -> (HTTP status or None for a transport failure, retried by the client?)
BROKEN: dict[str, tuple[int | None, bool]] = {
    "trickle": (None, True),
    "hang": (None, True),
    "slow": (None, True),
    "truncated": (None, True),
    "reset": (None, True),
    "not_http": (None, True),
    "status_500": (500, True),
    "status_429": (429, True),
    "status_503_html": (503, True),
    "status_400": (400, False),
}


def _first_turn(request: dict[str, Any]) -> bool:
    return not any(m["role"] in ("assistant", "tool") for m in request["messages"])


#: mode -> the malformed tool calls sent as the first turn of an episode.
BAD_TOOL_CALLS: dict[str, Any] = {
    "tool_name_null": [_call(None, None, None)],
    "tool_name_empty": [_call("")],
    "tool_name_number": [_call(42)],
    "tool_name_blank": [_call("   ")],
    "tool_calls_string": "calculator(1+1)",
    "tool_calls_object": {"name": "calculator", "arguments": "{}"},
    "tool_call_not_object": ["calculator"],
    "tool_call_no_function": [{"id": "c1", "type": "function"}],
}

#: mode -> a first turn whose tool call is deeply nested *inside* text the model wrote (the
#: arguments string, a ``<tool_call>`` block): well-formed replies, left to the environment.
DEEP_IN_TEXT: dict[str, dict[str, Any]] = {
    "deep_arguments": completion(None, [_call("calculator", "[" * _DEEP)]),
    "deep_tool_call_text": completion("<tool_call>" + "[" * _DEEP + "</tool_call>"),
}


class HostileOpenAI:
    """Serve ``mode`` on ``127.0.0.1`` (see the module docstring). ``requests`` counts POSTs."""

    def __init__(self, mode: str) -> None:
        known = {*MALFORMED, *BROKEN, *BAD_TOOL_CALLS, *DEEP_IN_TEXT, "good", "flaky"}
        if mode not in known:
            raise ValueError(f"unknown mode {mode!r}")
        self.mode = mode
        self.requests = 0
        self.port = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seen: set[str] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @contextmanager
    def running(self) -> Iterator[HostileOpenAI]:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()  # sleeping handlers return now
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)

    def count(self) -> int:
        with self._lock:
            self.requests += 1
            return self.requests

    def respond(self, h: BaseHTTPRequestHandler, request: dict[str, Any]) -> None:
        mode = self.mode
        if mode in MALFORMED:
            body = MALFORMED[mode]
            kind = "text/plain" if mode == "text_plain" else "application/json"
            return _send(h, 200, body, kind)
        if mode in DEEP_IN_TEXT:
            if _first_turn(request):
                return _send(h, 200, DEEP_IN_TEXT[mode])
            return _send(h, 200, completion(answer(request)))
        if mode in BAD_TOOL_CALLS:
            if _first_turn(request):
                return _send(h, 200, completion(None, BAD_TOOL_CALLS[mode]))
            return _send(h, 200, completion(answer(request)))
        if mode == "flaky":  # each request garbage the first time it is seen, then good
            key = json.dumps(request["messages"], sort_keys=True)
            with self._lock:
                first = key not in self._seen
                self._seen.add(key)
            if first:
                return _send(h, 200, MALFORMED["invalid_json"])
        if mode in ("good", "flaky"):
            return _send(h, 200, completion(answer(request)))
        return self._broken(h, request)

    def _broken(self, h: BaseHTTPRequestHandler, request: dict[str, Any]) -> None:
        mode = self.mode
        if mode == "trickle":  # headers at once, then one byte a second, for an hour
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "100000")
            h.end_headers()
            for _ in range(3600):
                if self._stop.wait(1.0):
                    return
                h.wfile.write(b" ")
                h.wfile.flush()
            return
        if mode == "hang":
            self._stop.wait(3600)
            return
        if mode == "slow":  # a correct answer, long after the client's deadline
            if not self._stop.wait(30):
                _send(h, 200, completion(answer(request)))
            return
        if mode == "truncated":
            data = json.dumps(completion(answer(request))).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data) + 500))
            h.end_headers()
            h.wfile.write(data[:40])
            h.wfile.flush()
            h.close_connection = True
            return
        if mode == "reset":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "not_http":
            h.wfile.write(b"\x00\x01garbage that is not HTTP\r\n\r\n")
            h.wfile.flush()
            h.close_connection = True
            return
        status = BROKEN[mode][0]
        assert status is not None
        if mode == "status_503_html":
            return _send(h, 503, b"<html>Service Unavailable</html>", "text/html")
        headers = [("Retry-After", "1")] if status == 429 else []
        return _send(h, status, {"error": {"message": f"hostile {status}"}}, headers=headers)


def _send(
    h: BaseHTTPRequestHandler,
    status: int,
    body: bytes | dict[str, Any],
    kind: str = "application/json",
    headers: list[tuple[str, str]] | None = None,
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h.send_response(status)
    h.send_header("Content-Type", kind)
    for key, value in headers or []:
        h.send_header(key, value)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)
    h.wfile.flush()


def _handler(server: HostileOpenAI) -> Callable[..., BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            _send(self, 200, {"object": "list", "data": [{"id": "x", "object": "model"}]})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            request = json.loads(self.rfile.read(length) or b"{}")
            server.count()
            # The client may give up first (its deadline): expected in the slow modes.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                server.respond(self, request)

    return Handler
