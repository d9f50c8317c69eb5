"""The built-in engine's continuous batching, on the real default model (greedy, CPU)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.serving.engine import Engine, GenerationRequest, GenerationResult


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Any:
    torch.set_num_threads(1)
    eng = Engine(model_dir, max_batch_size=4)
    yield eng
    eng.close()


def _request(engine: Engine, text: str, max_tokens: int, **kw: Any) -> GenerationRequest:
    ids = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    return GenerationRequest(prompt_ids=list(ids), max_tokens=max_tokens, temperature=0.0, **kw)


def _wait_steps(engine: Engine, steps: int) -> None:
    deadline = time.monotonic() + 120
    while engine.decode_steps < steps:
        assert time.monotonic() < deadline, "the engine made no progress"
        time.sleep(0.005)


def _same(a: GenerationResult, b: GenerationResult) -> None:
    assert a.token_ids == b.token_ids
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3


def test_a_request_joining_mid_generation_matches_running_alone(engine: Engine) -> None:
    long = _request(engine, "Write a long story about a cat.", 40, ignore_eos=True)
    short = _request(engine, "What is 2+2?", 8, ignore_eos=True)
    alone_long = engine.submit(long).result()
    alone_short = engine.submit(short).result()

    start = engine.decode_steps
    f_long = engine.submit(long)
    _wait_steps(engine, start + 10)  # the long row is mid-generation
    f_short = engine.submit(short)
    joined_short = f_short.result()
    # the short row joined the running batch and came back while the long one still runs
    assert not f_long.done()
    joined_long = f_long.result()
    _same(alone_short, joined_short)
    _same(alone_long, joined_long)
    # both shared decode steps: fewer steps than running one after the other
    assert engine.decode_steps - start < 40 + 8 - 1


def test_rows_of_different_lengths_finish_independently(engine: Engine) -> None:
    lengths = [3, 30, 9, 17]
    reqs = [_request(engine, f"Count to {n}.", n, ignore_eos=True) for n in lengths]
    alone = [engine.submit(r).result() for r in reqs]
    futures = [engine.submit(r) for r in reqs]
    finished_order: list[int] = []
    while len(finished_order) < len(futures):
        finished_order += [i for i, f in enumerate(futures) if f.done() and i not in finished_order]
        time.sleep(0.002)
    assert finished_order == sorted(range(4), key=lambda i: lengths[i])
    for a, f in zip(alone, futures, strict=True):
        _same(a, f.result())
        assert len(f.result().token_ids) == len(a.token_ids)


def test_more_requests_than_rows_queue_and_all_complete(engine: Engine) -> None:
    reqs = [_request(engine, f"Name a colour ({i}).", 4 + i, ignore_eos=True) for i in range(7)]
    results = [f.result() for f in [engine.submit(r) for r in reqs]]
    assert [len(r.token_ids) for r in results] == [4 + i for i in range(7)]
    assert all(r.finish_reason == "length" for r in results)


def test_pause_aborts_running_rows_and_holds_new_ones(engine: Engine) -> None:
    start = engine.decode_steps
    running = engine.submit(_request(engine, "Tell me about the sea.", 200, ignore_eos=True))
    _wait_steps(engine, start + 3)
    engine.pause()
    try:
        result = running.result(timeout=5)
        assert result.finish_reason == "abort"
        assert 0 < len(result.token_ids) < 200
        queued = engine.submit(_request(engine, "Hi", 3, ignore_eos=True))
        time.sleep(0.3)
        assert not queued.done()
    finally:
        engine.resume()
    assert len(queued.result(timeout=60).token_ids) == 3
