"""``python -m areal_agents.serving.serve --model PATH``: the built-in OpenAI-compatible server.

Serves a transformers causal LM (the offline default SmolLM2-135M-Instruct unless ``--model``
names another local HF directory) on CPU or GPU, bound to 127.0.0.1 unless told otherwise.
When it listens it prints ``serving NAME at http://HOST:PORT/v1 (ready; ...)`` to stdout.

Shutdown is prompt: on SIGTERM or SIGINT the engine is closed at once (the running batch ends
at its next decoding step with ``finish_reason="abort"``, queued requests fail), uvicorn gets
``--shutdown-grace-s`` seconds to answer what is in flight, and a watchdog ends the process
if it is still alive a few seconds after that. With ``--parent-pid PID`` the server also shuts
down when that process is gone (the launcher passes its own pid, so a killed trainer or eval
leaves no server behind).

Security: with ``--api-key`` or, better, the environment variable ``AREAL_SERVER_API_KEY`` (a
command line is readable by every local user), every route but ``GET /health`` needs
``Authorization: Bearer KEY``: the training routes too. Requests are bounded before they cost
anything (``--max-request-mb``, ``--max-request-sequences``, the context length counted in
characters before tokenising): :mod:`areal_agents.serving.api` says what the server trusts.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from areal_agents.serving.api_errors import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_REQUEST_SEQUENCES,
)
from areal_agents.serving.auth import server_api_key
from areal_agents.serving.base import LOGPROBS_MODES
from areal_agents.serving.prefix_cache import DEFAULT_PREFIX_CACHE_MB

if TYPE_CHECKING:
    import uvicorn

    from areal_agents.serving.engine import Engine

__all__ = ["main", "watch_parent"]

logger = logging.getLogger(__name__)

_HARD_EXIT_MARGIN_S = 5.0
"""Seconds past the graceful-shutdown timeout after which the process ends regardless."""


def watch_parent(parent_pid: int, interval_s: float = 0.5, signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to this process once ``parent_pid`` is no longer its parent.

    The check is ``os.getppid()``, which changes when the parent dies (the child is adopted),
    so a recycled pid cannot fool it. Runs in a daemon thread; returns at once. If the parent
    is already gone, the signal is sent before returning.
    """

    def loop() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        logger.warning("parent process %d is gone: shutting down", parent_pid)
        os.kill(os.getpid(), signum)

    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)
        return
    threading.Thread(target=loop, name="areal-parent-watch", daemon=True).start()


def _exit_after(seconds: float, code: int) -> None:
    """End the process with ``code`` after ``seconds`` unless it has ended by then."""

    def fire() -> None:
        time.sleep(seconds)
        sys.stderr.write(f"shutdown took over {seconds:.0f} s: exiting now\n")
        sys.stderr.flush()
        os._exit(code)

    threading.Thread(target=fire, name="areal-exit-deadline", daemon=True).start()


def _server(
    config: uvicorn.Config, engine: Engine, grace_s: float, ready_line: str = ""
) -> uvicorn.Server:
    """A uvicorn server whose exit signals also close ``engine`` and arm a hard deadline.

    Once it listens, ``ready_line`` (when given) is printed to stdout, flushed.
    """
    import socket

    import uvicorn

    class Server(uvicorn.Server):
        closing = False

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and ready_line:
                print(ready_line, flush=True)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            if self.closing:
                return
            self.closing = True
            # engine.close() joins the scheduler thread: never block the event loop on it.
            threading.Thread(target=engine.close, name="areal-engine-close", daemon=True).start()
            _exit_after(grace_s + _HARD_EXIT_MARGIN_S, 128 + int(sig))

    return Server(config)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m areal_agents.serving.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="default", help="local HF model directory, or 'default'")
    parser.add_argument("--served-model-name", default=None, help="name clients send as `model`")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, or auto")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=DEFAULT_PREFIX_CACHE_MB,
        help="memory for the KV cache of prompt prefixes reused across requests (the shared "
        "system prompt, the previous turn of an episode); 0 disables prefix caching",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="require this bearer token on every route but /health (default: the environment "
        "variable AREAL_SERVER_API_KEY, which other local users cannot read)",
    )
    parser.add_argument(
        "--max-request-mb",
        type=float,
        default=DEFAULT_MAX_REQUEST_BYTES / (1 << 20),
        help="largest request body (32; weight updates excepted)",
    )
    parser.add_argument(
        "--max-request-sequences",
        type=int,
        default=DEFAULT_MAX_REQUEST_SEQUENCES,
        help="most sequences (prompts x n) one request may ask for (256)",
    )
    parser.add_argument(
        "--logprobs-mode",
        choices=LOGPROBS_MODES,
        default="raw_logprobs",
        help="the log-probs reported: the raw model's (vLLM's default), or processed_logprobs, "
        "those of the distribution each token was drawn from (temperature and top-p applied: "
        "what RL needs as behaviour log-probs; the same flag as vLLM's)",
    )
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="shut down when this process is gone"
    )
    parser.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=2.0,
        help="seconds in-flight requests get to answer after SIGTERM (the engine is closed at "
        "once, so they can only fail; a forward pass under way may hold them this long)",
    )
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        watch_parent(args.parent_pid)  # before the slow imports: an orphan never loads a model

    import uvicorn

    from areal_agents.serving.api import create_app
    from areal_agents.serving.engine import Engine
    from areal_agents.serving.model import DEFAULT_MODEL_NAME, resolve_model

    logging.basicConfig(level=args.log_level.upper())
    path = resolve_model(args.model)
    name = args.served_model_name or (
        DEFAULT_MODEL_NAME if args.model in ("default", DEFAULT_MODEL_NAME) else Path(path).name
    )
    engine = Engine(
        path,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_batch_size=args.max_batch_size,
        prefix_cache_mb=args.prefix_cache_mb,
        logprobs_mode=args.logprobs_mode,
    )
    app = create_app(
        engine,
        name,
        api_key=server_api_key(args.api_key),
        max_request_bytes=int(args.max_request_mb * (1 << 20)),
        max_request_sequences=args.max_request_sequences,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=max(1, round(args.shutdown_grace_s)),
    )
    url = f"http://{args.host}:{args.port}/v1"
    ready = f"serving {name} at {url} (ready; OpenAI-compatible: {url}/chat/completions)"
    try:
        _server(config, engine, args.shutdown_grace_s, ready).run()
    finally:
        engine.close()


if __name__ == "__main__":
    main()
