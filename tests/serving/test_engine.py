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


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_processed_logprobs_are_the_sampling_distributions(model_dir: Path, top_p: float) -> None:
    """With ``logprobs_mode=processed_logprobs`` a token sampled at temperature 0.6 reports its
    log-prob under the tempered (and top-p cut) distribution it was drawn from, as the learner
    computes it (``log_softmax(logits / T)``); the raw mode reports ``log_softmax(logits)``.
    Forced tokens (a continued generation) are reported the same way."""
    from areal_agents.serving.sampling import sampling_logprobs

    torch.set_num_threads(1)
    processed = Engine(model_dir, max_batch_size=2, logprobs_mode="processed_logprobs")
    try:
        req = _request(processed, "Write a poem about the sea.", 12, ignore_eos=True)
        req.temperature, req.top_p, req.seed = 0.6, top_p, 7
        out = processed.submit(req).result()
        forced = _request(processed, "Write a poem about the sea.", 4, ignore_eos=True)
        forced.temperature, forced.top_p, forced.seed = 0.6, top_p, 7
        forced.forced_prefix = tuple(out.token_ids[:5])
        again = processed.submit(forced).result()
        ids = torch.tensor([req.prompt_ids + out.token_ids])
        with torch.no_grad():
            logits = processed.model(input_ids=ids).logits[0].double()
    finally:
        processed.close()
    n = len(req.prompt_ids)
    steps = range(n - 1, n - 1 + len(out.token_ids))
    want = [float(sampling_logprobs(logits[t], 0.6, top_p)[ids[0, t + 1]]) for t in steps]
    raw = [float(torch.log_softmax(logits[t], -1)[ids[0, t + 1]]) for t in steps]
    assert max(abs(a - b) for a, b in zip(out.logprobs, want, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(out.logprobs, raw, strict=True)) > 0.05  # not raw
    assert max(abs(a - b) for a, b in zip(again.logprobs[:5], want[:5], strict=True)) < 1e-4
    with pytest.raises(Exception, match="logprobs_mode"):
        Engine(model_dir, logprobs_mode="tempered")
