"""Automatic prefix caching: the LRU itself, and the engine's results with it equal to without.

Every engine check runs the same requests on two engines of the same weights, one with the
prefix cache and one without (``prefix_cache_mb=0``), and asserts the same tokens and
log-probabilities, plus that the cache was really used (tokens reused), so that a cache that
silently stopped matching would fail too. The equality checks run on the tiny model and on the
real default model; the weight-update checks on the tiny one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.serving.adapters import PEFT_PREFIX
from areal_agents.serving.engine import Engine, GenerationRequest, GenerationResult
from areal_agents.serving.prefix_cache import PrefixCache, common_prefix_length, shared_prefix

SYSTEM = (
    "You are a careful programmer. Solve the task with the tools you are given; run code "
    "before you answer, and answer with one fenced Python block. " * 3
)
TOLERANCE = 1e-4


# ---- the cache on its own -------------------------------------------------------------------


def kv(n: int, value: float = 0.0, layers: int = 2) -> list[torch.Tensor]:
    """Per-layer keys (or values) of ``n`` tokens: [1 head, n, 4], 16 bytes per token."""
    return [torch.full((1, n, 4), value) for _ in range(layers)]


def test_common_prefix_length_counts_the_shared_leading_tokens() -> None:
    assert common_prefix_length((), (1, 2)) == 0
    assert common_prefix_length([1, 2, 3], (1, 2, 3)) == 3  # lists and tuples alike
    assert common_prefix_length(range(100), [*range(57), -1, *range(58, 100)]) == 57
    assert common_prefix_length((9, 1), (1, 9)) == 0


def test_a_match_is_the_longest_cached_prefix_cut_to_the_limit() -> None:
    cache = PrefixCache(max_bytes=2**20, min_tokens=4)
    short, long = list(range(8)), [*range(6), 50, 51, 52, 53]
    assert cache.insert(short, kv(8, 1.0), kv(8, 2.0))
    assert cache.insert(long, kv(10, 3.0), kv(10, 4.0))
    m = cache.match([*range(8), 99], limit=100)
    assert m is not None and m.length == 8
    assert float(m.keys[0].sum()) == 8 * 4 * 1.0 and float(m.values[1].mean()) == 2.0
    m = cache.match([*range(6), 50, 51, 52], limit=100)
    assert m is not None and m.length == 9 and float(m.keys[0].mean()) == 3.0
    m = cache.match(short, limit=len(short) - 1)  # the prompt is a cached prefix: one stays
    assert m is not None and m.length == 7 and m.keys[0].shape[-2] == 7
    assert cache.match([0, 1, 2, 9], limit=100) is None  # 3 < min_tokens
    assert cache.match(list(range(8)), limit=3) is None  # cut below min_tokens
    stats = cache.stats()
    assert stats["hits"] == 3 and stats["lookups"] == 5 and stats["reused_tokens"] == 8 + 9 + 7


def test_the_lru_is_bounded_in_bytes_and_entries() -> None:
    per_entry = 2 * 2 * 10 * 16  # keys and values, 2 layers, 10 tokens, 16 bytes each
    cache = PrefixCache(max_bytes=3 * per_entry, min_tokens=4, max_entries=10)
    prompts = [[i, *range(100, 109)] for i in range(4)]
    for p in prompts[:3]:
        assert cache.insert(p, kv(10), kv(10))
    assert cache.match(prompts[0], limit=9) is not None  # 0 is now the most recently used
    assert cache.insert(prompts[3], kv(10), kv(10))  # over the byte budget: 1 goes
    assert cache.stats()["entries"] == 3 and cache.stats()["bytes"] == 3 * per_entry
    assert cache.match(prompts[1], limit=9) is None
    assert all(cache.match(prompts[i], limit=9) is not None for i in (0, 2, 3))
    assert not cache.insert(list(range(200, 240)), kv(40), kv(40))  # larger than the budget
    few = PrefixCache(max_bytes=2**20, min_tokens=4, max_entries=2)
    for p in prompts:
        few.insert(p, kv(10), kv(10))
    assert few.stats()["entries"] == 2 and few.stats()["evicted"] == 2
    assert few.match(prompts[0], limit=9) is None and few.match(prompts[3], limit=9) is not None


def test_entries_contained_in_others_are_not_kept_twice() -> None:
    cache = PrefixCache(max_bytes=2**20, min_tokens=4)
    assert cache.insert(range(6), kv(6), kv(6))
    assert cache.insert(range(10), kv(10), kv(10))  # the 6-token entry is inside it: dropped
    assert cache.stats()["entries"] == 1 and cache.stats()["bytes"] == 2 * 2 * 10 * 16
    assert not cache.wants(range(8)) and not cache.insert(range(8), kv(8), kv(8))
    assert cache.wants([*range(5), 77])
    with pytest.raises(ValueError, match="KV of 5 tokens"):
        cache.insert(range(5), kv(6), kv(6))


def test_observe_reports_the_prefix_shared_with_recent_prompts() -> None:
    cache = PrefixCache(max_bytes=2**20, min_tokens=4, history=2)
    assert cache.observe([1, 2, 3, 4, 5]) == 0
    assert cache.observe([1, 2, 3, 9]) == 3
    assert cache.observe([7, 8]) == 0
    assert cache.observe([1, 2, 3, 4, 5, 6]) == 3  # [1..5] left the 2-prompt history
    cache.insert(range(6), kv(6), kv(6))
    cache.clear()
    assert cache.stats()["entries"] == 0 and cache.observe([1, 2, 3, 9]) == 0


def test_shared_prefix_is_the_one_that_saves_most_prefill() -> None:
    system, task = (7,) * 40, (8,) * 35
    group = [(*system, *task, i) for i in range(2)]  # two rows of one task, other endings
    assert shared_prefix([(*system, 1), (2,) * 50], 32) is None  # nothing shared
    assert shared_prefix([(3,) * 31 + (1,), (3,) * 31 + (2,)], 32) is None  # too short
    assert shared_prefix([*group, (*system, 5)], 32) == system  # 2 x 40 > 1 x 75
    assert shared_prefix(group, 32) == system + task
    assert shared_prefix(group, 32, lambda p: 40) == system + task  # 35 new tokens
    assert shared_prefix(group, 32, lambda p: 50) is None  # 25 new: under min_tokens
    cache = PrefixCache(max_bytes=2**20, min_tokens=32)
    cache.insert(system + (9,) * 10, kv(50), kv(50))
    assert cache.cached_length(system + task) == 40 and cache.stats()["lookups"] == 0
    assert shared_prefix([*group, (*system, 5)], 32, cache.cached_length) == system + task


def test_a_disabled_cache_stores_nothing() -> None:
    cache = PrefixCache(max_bytes=0)
    assert not cache.enabled
    assert cache.observe(range(50)) == 0 and cache.observe(range(50)) == 0
    assert not cache.wants(range(50)) and not cache.insert(range(50), kv(50), kv(50))
    assert cache.match(range(50), limit=49) is None and cache.stats()["lookups"] == 0
    with pytest.raises(ValueError):
        PrefixCache(max_bytes=-1)


# ---- the engine, with the cache and without ---------------------------------------------------


class Pair:
    """Two engines of the same weights: ``on`` caches prefixes, ``off`` does not."""

    def __init__(self, path: Path) -> None:
        self.on = Engine(path, max_batch_size=8)
        self.off = Engine(path, max_batch_size=8, prefix_cache_mb=0)
        self.tok = self.on.tokenizer

    def prompt(self, user: str, system: str = SYSTEM) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])

    def both(self, *requests: GenerationRequest) -> tuple[list[Any], list[Any]]:
        """Results of ``requests`` submitted at once, on each engine."""
        return [self.run(e, requests) for e in (self.on, self.off)]  # type: ignore[return-value]

    @staticmethod
    def run(engine: Engine, requests: tuple[GenerationRequest, ...]) -> list[GenerationResult]:
        futures = [engine.submit(r) for r in requests]
        return [f.result(timeout=600) for f in futures]

    def reused(self) -> int:
        return int(self.on.prefix_cache.stats()["reused_tokens"])

    def close(self) -> None:
        self.on.close()
        self.off.close()


def greedy(prompt: list[int], n: int, **kw: Any) -> GenerationRequest:
    return GenerationRequest(prompt_ids=prompt, max_tokens=n, temperature=0.0, **kw)


def assert_same(a: GenerationResult, b: GenerationResult) -> None:
    assert a.token_ids == b.token_ids
    assert a.finish_reason == b.finish_reason
    diff = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
    assert diff < TOLERANCE, f"logprobs differ by {diff:.2e}"
    for top_a, top_b in zip(a.top_logprobs, b.top_logprobs, strict=True):
        assert [t for t, _ in top_a] == [t for t, _ in top_b]


def wait_steps(engine: Engine, steps: int) -> None:
    deadline = time.monotonic() + 300
    while engine.decode_steps < steps:
        assert time.monotonic() < deadline, "the engine made no progress"
        time.sleep(0.005)


@pytest.fixture(scope="module", params=["tiny", "default"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    from areal_agents.trainers.modeling import resolve_model_dir

    torch.set_num_threads(1)
    engines = Pair(resolve_model_dir(request.param))
    yield engines
    engines.close()


def test_rows_on_cached_prefixes_match_rows_without_the_cache(pair: Pair) -> None:
    """Several rows with different suffixes join a running batch on top of a cached prefix:
    greedy rows, a forced prefix, seeded sampling with top-p and top logprobs."""
    first, second = pair.prompt("Write add(a, b)."), pair.prompt("Write a function mul.")
    shared = common_prefix_length(first, second)
    assert shared >= 32  # the system prompt and the user header
    for a, b in zip(*pair.both(greedy(first, 4)), strict=True):  # nothing cached yet
        assert_same(a, b)
    for a, b in zip(*pair.both(greedy(second, 4)), strict=True):  # stores the shared prefix
        assert_same(a, b)
    assert pair.on.prefix_cache.stats()["entries"] >= 1
    before = pair.reused()

    call = '<tool_call>\n{"name": "python", "arguments": {"code": "'
    tool = pair.tok.encode(call, add_special_tokens=False)
    group = (
        greedy(pair.prompt("Hi"), 6, ignore_eos=True),
        greedy(pair.prompt("Reverse a string s and return it, " * 4), 9, ignore_eos=True),
        greedy(
            pair.prompt("Sum a list."), len(tool) + 5, forced_prefix=tuple(tool), top_logprobs=3
        ),
        GenerationRequest(
            prompt_ids=pair.prompt("Write fib(n)."),
            max_tokens=8,
            temperature=0.9,
            top_p=0.95,
            seed=1234,
            ignore_eos=True,
            top_logprobs=2,
        ),
    )
    long = greedy(pair.prompt("Tell me a long story about a cat."), 24, ignore_eos=True)
    results = []
    for engine in (pair.on, pair.off):
        start = engine.decode_steps
        running = engine.submit(long)
        wait_steps(engine, start + 3)  # the long row is mid-generation: the group joins it
        joined = Pair.run(engine, group)
        assert not running.done()  # the group joined the running batch, did not wait for it
        results.append([running.result(timeout=600), *joined])
    for a, b in zip(*results, strict=True):
        assert_same(a, b)
    assert len(results[0][3].token_ids) == 5 + len(tool)
    # every row of the group (and the long one) started on the cached shared prefix
    least = sum(min(shared, common_prefix_length(r.prompt_ids, second)) for r in (long, *group))
    assert least >= (len(group) + 1) * 32
    assert pair.reused() - before >= least


def test_rows_admitted_together_prefill_their_shared_prefix_once(pair: Pair) -> None:
    system = "You grade essays. Read the essay, list its faults, and give a mark out of ten. " * 2
    others = [pair.prompt(u, system) for u in ("Short.", "An essay on rain.", "Mine: cats.")]
    task = pair.prompt("Essay: the sea is wide and deep and cold, and we love it so. " * 3, system)
    shared = min(common_prefix_length(others[0], p) for p in [*others[1:], task])
    assert shared >= 32 and len(task) - shared >= 32
    requests = [greedy(p, 5, ignore_eos=True) for p in [*others, task, task]]
    results = []
    before = pair.reused()
    for engine in (pair.on, pair.off):
        engine.pause()  # all five are admitted in one prefill when it resumes
        futures = [engine.submit(r) for r in requests]
        engine.resume()
        results.append([f.result(timeout=600) for f in futures])
    for a, b in zip(*results, strict=True):
        assert_same(a, b)
    # the system prompt, then the twice-asked prompt, were each prefilled once, alone
    assert pair.reused() - before >= 3 * shared + 2 * (len(task) - 1)


def test_a_prompt_equal_to_a_cached_prefix_still_prefills_its_last_token(pair: Pair) -> None:
    prompt = pair.prompt("Is 17 prime?")
    for _ in range(2):  # the second time it is stored whole (shared with the first)
        for a, b in zip(*pair.both(greedy(prompt, 5)), strict=True):
            assert_same(a, b)
    assert not pair.on.prefix_cache.wants(prompt)  # held whole
    before = pair.reused()
    a, b = (r[0] for r in pair.both(greedy(prompt, 5)))
    assert pair.reused() - before == len(prompt) - 1
    assert_same(a, b)


def test_the_next_turn_reuses_the_finished_turn(pair: Pair) -> None:
    prompt = pair.prompt("Print hello and stop.", system=SYSTEM + " Be brief.")
    probe = Pair.run(pair.off, (greedy(prompt, 8, ignore_eos=True),))[0].token_ids
    stop = probe[4]  # a turn that ends with "stop" at its first occurrence of this token
    turn1 = greedy(prompt, 8, ignore_eos=True, stop_token_ids=frozenset({stop}))
    a, b = (r[0] for r in pair.both(turn1))
    assert_same(a, b)
    assert a.finish_reason == "stop" and a.token_ids[-1] == stop
    tool = pair.tok.encode("<|im_start|>tool\nhello<|im_end|>\n<|im_start|>assistant\n")
    history = prompt + a.token_ids + tool
    before = pair.reused()
    c, d = (r[0] for r in pair.both(greedy(history, 6, ignore_eos=True)))
    assert pair.reused() - before >= len(prompt) + len(a.token_ids) - 1
    assert_same(c, d)


# ---- weight updates invalidate the cache ------------------------------------------------------


@pytest.fixture()
def tiny_pair() -> Iterator[Pair]:
    from areal_agents.trainers.modeling import tiny_model_path

    torch.set_num_threads(1)
    engines = Pair(tiny_model_path())
    yield engines
    engines.close()


def _warm(pair: Pair) -> list[int]:
    prompt = pair.prompt("Write add(a, b).")
    for _ in range(2):
        Pair.run(pair.on, (greedy(prompt, 4),))
    assert pair.on.prefix_cache.stats()["entries"] >= 1
    return prompt


def _perturbed(engine: Engine) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        k: v + 0.5 * v.std() * torch.randn(v.shape, generator=gen)
        for k, v in engine.model.state_dict().items()
    }


def _check_after_update(pair: Pair, prompt: list[int]) -> None:
    assert pair.on.prefix_cache.stats()["entries"] == 0  # cleared with the old weights
    a, b = (r[0] for r in pair.both(greedy(prompt, 6, ignore_eos=True)))
    assert a.weight_version == b.weight_version == 1
    assert_same(a, b)


def test_update_weights_clears_the_cache(tiny_pair: Pair) -> None:
    prompt = _warm(tiny_pair)
    state = _perturbed(tiny_pair.on)
    for engine in (tiny_pair.on, tiny_pair.off):
        engine.update_weights(state, 1)
    _check_after_update(tiny_pair, prompt)


def test_update_weights_from_disk_clears_the_cache(tiny_pair: Pair, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    prompt = _warm(tiny_pair)
    state = {k: v.contiguous() for k, v in _perturbed(tiny_pair.on).items()}
    state.pop("lm_head.weight", None)  # tied to the embeddings, as a checkpoint saves it
    save_file(state, str(tmp_path / "model.safetensors"))
    for engine in (tiny_pair.on, tiny_pair.off):
        engine.update_weights_from_disk(tmp_path, 1)
    _check_after_update(tiny_pair, prompt)


def test_an_adapter_update_clears_the_cache(tiny_pair: Pair) -> None:
    prompt = _warm(tiny_pair)
    gen = torch.Generator().manual_seed(1)
    adapter = {}
    for layer in range(2):
        for proj in ("q_proj", "v_proj"):
            name = f"{PEFT_PREFIX}model.layers.{layer}.self_attn.{proj}"
            out = tiny_pair.on.model.state_dict()[name.removeprefix(PEFT_PREFIX) + ".weight"]
            adapter[f"{name}.lora_A.weight"] = torch.randn(4, out.shape[1], generator=gen)
            adapter[f"{name}.lora_B.weight"] = torch.randn(out.shape[0], 4, generator=gen)
    for engine in (tiny_pair.on, tiny_pair.off):
        engine.update_adapter(adapter, 0.5, 1)
    _check_after_update(tiny_pair, prompt)


def test_a_cache_that_cannot_be_reused_turns_prefix_caching_off(
    tiny_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("areal_agents.serving.engine_rows.reusable", lambda cache: False)
    prompt = tiny_pair.prompt("Write add(a, b).")
    for _ in range(3):
        a, b = (r[0] for r in tiny_pair.both(greedy(prompt, 4)))
        assert_same(a, b)
    assert not tiny_pair.on.prefix_cache.enabled
    assert tiny_pair.on.prefix_cache.stats()["reused_tokens"] == 0


def test_the_server_reports_the_engines_counters(tiny_pair: Pair) -> None:
    from fastapi.testclient import TestClient

    from areal_agents.serving.api import create_app

    prompt = _warm(tiny_pair)
    Pair.run(tiny_pair.on, (greedy(prompt, 4),))  # a hit
    with TestClient(create_app(tiny_pair.on, "tiny")) as client:
        stats = client.get("/weight_version").json()
    assert stats["weight_version"] == 0 and stats["decode_steps"] == tiny_pair.on.decode_steps
    assert stats["prefill_s"] > 0 and stats["decode_s"] > 0 and stats["prefill_cpu_s"] > 0
    assert stats["prefix_cache"]["stored"] >= 1 and stats["prefix_cache"]["hits"] >= 1


def test_a_prefill_of_cached_and_uncached_rows_leaves_no_padding_between(tiny_pair: Pair) -> None:
    from concurrent.futures import Future

    from areal_agents.serving.batch import Row

    hit = _warm(tiny_pair)
    miss = tiny_pair.prompt("Something else entirely, with no system prompt.", system="Hi.")
    requests = [greedy(hit, 5, ignore_eos=True), greedy(miss, 5, ignore_eos=True)]
    results = []
    for engine in (tiny_pair.on, tiny_pair.off):
        engine.pause()  # both in one prefill
        futures = [engine.submit(r) for r in requests]
        engine.resume()
        results.append([f.result(timeout=600) for f in futures])
    for a, b in zip(*results, strict=True):
        assert_same(a, b)
    # the batch that decoding sees is as wide as its longest row, not prefix + longest rest
    engine = tiny_pair.on
    engine.pause()
    rows = [Row(r, Future(), torch.Generator()) for r in requests]
    batch = engine._prefill(rows)
    assert engine.prefix_cache.match(hit, len(hit) - 1) is not None
    assert batch.mask.shape[1] == max(len(hit), len(miss))
    assert sorted(batch.mask.sum(-1).tolist()) == sorted([len(hit), len(miss)])
    engine.resume()


def test_rows_prefilling_very_different_lengths_run_in_separate_passes(
    tiny_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    hit = _warm(tiny_pair)  # cached whole: one token left to prefill
    miss = tiny_pair.prompt("Something else entirely. " * 12, system="Hi.")
    assert len(miss) > 64
    passes: list[list[int]] = []
    forward = tiny_pair.on._forward

    def spy(sequences: list[list[int]], matches: list[Any], keep: int) -> Any:
        passes.append(
            [len(s) - (m.length if m else 0) for s, m in zip(sequences, matches, strict=True)]
        )
        return forward(sequences, matches, keep)

    monkeypatch.setattr(tiny_pair.on, "_forward", spy)
    requests = [greedy(hit, 5, ignore_eos=True), greedy(miss, 5, ignore_eos=True)]
    results = []
    for engine in (tiny_pair.on, tiny_pair.off):
        engine.pause()  # both admitted together
        futures = [engine.submit(r) for r in requests]
        engine.resume()
        results.append([f.result(timeout=600) for f in futures])
    for a, b in zip(*results, strict=True):
        assert_same(a, b)
    assert passes == [[len(miss)], [1]]  # not one pass padding the cached row to len(miss)
