"""``python -m areal_agents.policies.serve --model PATH``: the built-in OpenAI-compatible server.

Serves a transformers causal LM (the offline default SmolLM2-135M-Instruct unless ``--model``
names another local HF directory) on CPU or GPU, bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m areal_agents.policies.serve", description=__doc__
    )
    parser.add_argument("--model", default="default", help="local HF model directory, or 'default'")
    parser.add_argument("--served-model-name", default=None, help="name clients send as `model`")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, or auto")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--api-key", default=None, help="require this bearer token on /v1/")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    import uvicorn

    from areal_agents.policies.api import create_app
    from areal_agents.policies.engine import Engine
    from areal_agents.policies.model import DEFAULT_MODEL_NAME, resolve_model

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
    )
    app = create_app(engine, name, api_key=args.api_key)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
