"""The built-in engine's requests and its running batch: rows, KV cache and attention mask.

The batch keeps one row per sequence in a transformers ``DynamicCache`` (``[rows, kv heads,
columns, head dim]`` per layer) with a 2-D attention mask over its columns. Rows are
right-aligned: every row's newest token is in the last column. A column of a row is either one of
its tokens (mask 1, in order) or padding (mask 0), which is never attended to: at the start,
where rows of different lengths meet (left padding), or between a cached prefix and the rest of
its prompt (see :func:`prefill_inputs`). Position ids are explicit, so padding never shifts a
row's positions.

The functions here are the tensor work on that layout: building a prefill's inputs on top of
cached prefixes (:func:`prefill_inputs`, :func:`stack_prefixes`), merging newly prefilled rows
into the running batch (:func:`join`), dropping finished rows (:func:`keep_rows`), copying one
row's keys and values out (:func:`row_kv`) and into the prefix cache: the prefix a prompt shares
with recent ones (:func:`store_shared_prefixes`), a finished turn (:func:`store_turn`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_agents.serving.prefix_cache import PrefixCache, PrefixMatch

__all__ = [
    "Batch",
    "GenerationRequest",
    "GenerationResult",
    "Row",
    "cache_layers",
    "compact",
    "join",
    "keep_rows",
    "left_pad",
    "prefill_groups",
    "prefill_inputs",
    "reusable",
    "row_kv",
    "stack_prefixes",
    "store_shared_prefixes",
    "store_turn",
]


@dataclass
class GenerationRequest:
    """One sequence to sample (an ``n > 1`` API request becomes ``n`` of these)."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    forced_prefix: tuple[int, ...] = ()
    """Tokens emitted before sampling starts (e.g. ``<tool_call>`` when a tool is required)."""
    ignore_eos: bool = False
    """Keep going past end-of-sequence tokens (vLLM's ``ignore_eos``)."""
    on_token: Callable[[int], None] | None = field(default=None, repr=False, compare=False)
    """Called from the scheduler thread with each output token as it is chosen (forced tokens
    included), before the request's future resolves; for streaming. It must return at once."""
    cancelled: bool = field(default=False, repr=False, compare=False)
    """Set it (from any thread) to end the generation at the next step with
    ``finish_reason="abort"``: a streaming client went away."""


@dataclass
class GenerationResult:
    """The sampled tokens of one request and how the generation ended."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str
    stop_reason: int | str | None
    weight_version: int


@dataclass
class Row:
    """One request in the engine: its output so far and how it ended."""

    request: GenerationRequest
    future: Future[GenerationResult]
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str | None = None
    stop_reason: int | str | None = None


@dataclass
class Batch:
    """The running batch: its rows, their KV cache and attention mask (right-aligned rows),
    the next position of each row and the logits of its next token (not yet sampled)."""

    rows: list[Row]
    cache: Any
    mask: torch.Tensor
    next_pos: torch.Tensor
    last: torch.Tensor


def cache_layers(cache: Any) -> list[Any]:
    """The per-layer key/value holders of a transformers ``DynamicCache``."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"continuous batching needs a DynamicCache, got {type(cache).__name__}")
    return list(layers)


def reusable(cache: Any) -> bool:
    """Whether every layer of ``cache`` keeps all keys and values of its columns (plain
    ``DynamicLayer``s), so that a prefix can be copied out and reused. A sliding-window or
    quantised layer does not: the engine then runs without prefix caching."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers:
        return False
    return all(type(layer) is DynamicLayer for layer in layers)


def left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad ``t`` at the start of ``dim`` to ``width`` entries."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def prefill_groups(lengths: Sequence[int], waste: int = 32) -> list[list[int]]:
    """Row indices grouped into forward passes, given the tokens each row prefills.

    A prefill pads every row to its longest: one uncached 401-token prompt among rows that
    prefill 71 tokens on a cached prefix would make each of them compute 401. Rows go longest
    first; a row joins the current group unless it would be padded by more than half the
    group's longest and more than ``waste`` tokens.

    >>> prefill_groups([71, 401, 60, 90, 300, 1])
    [[1, 4], [3, 0, 2], [5]]
    >>> prefill_groups([20, 1, 5])
    [[0, 2, 1]]
    """
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        longest = lengths[groups[-1][0]] if groups else 0
        if groups and longest - lengths[i] <= max(longest // 2, waste):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def prefill_inputs(
    sequences: Sequence[Sequence[int]], cached: Sequence[int], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inputs of a prefill whose row ``i`` has its first ``cached[i]`` tokens in the KV cache.

    Returns ``(input_ids, attention_mask, position_ids)``: ``input_ids`` ``[rows, S]`` holds the
    uncached rest of each sequence, left-padded to the longest rest ``S``; the mask ``[rows, P +
    S]`` covers the cached prefixes (``P = max(cached)``, each right-aligned in its ``P``
    columns, see :func:`stack_prefixes`) and then the input; positions ``[rows, S]`` continue
    after each row's prefix. With nothing cached (``P = 0``) this is a plain left-padded batch.

    >>> ids, mask, pos = prefill_inputs([[5, 6, 7, 8], [5, 6, 9]], [2, 0], 0, torch.device("cpu"))
    >>> ids.tolist(), mask.tolist(), pos.tolist()
    ([[0, 7, 8], [5, 6, 9]], [[1, 1, 0, 1, 1], [0, 0, 1, 1, 1]], [[2, 2, 3], [0, 1, 2]])
    """
    rests = [list(s[c:]) for s, c in zip(sequences, cached, strict=True)]
    if not all(rests):
        raise ValueError("every row needs at least one uncached token (its logits)")
    width, prefix = max(len(r) for r in rests), max(cached)
    ids = torch.full((len(rests), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rests), prefix + width), dtype=torch.long)
    start = torch.tensor(cached, dtype=torch.long)
    for i, (rest, c) in enumerate(zip(rests, cached, strict=True)):
        ids[i, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
        mask[i, prefix - c : prefix] = 1
        mask[i, prefix + width - len(rest) :] = 1
    positions = start[:, None] + (mask[:, prefix:].cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


def stack_prefixes(matches: Sequence[PrefixMatch | None], config: Any, device: torch.device) -> Any:
    """A ``DynamicCache`` holding each row's cached prefix (``None``: no prefix), right-aligned
    in ``max(length)`` columns and zero elsewhere, for the mask of :func:`prefill_inputs`."""
    from transformers import DynamicCache

    present = [m for m in matches if m is not None]
    if not present:
        raise ValueError("no cached prefix to stack")
    width = max(m.length for m in present)
    layers = []
    for layer in range(len(present[0].keys)):
        stacked = []
        for part in ("keys", "values"):
            like: torch.Tensor = getattr(present[0], part)[layer]
            heads, _, dim = like.shape
            out = like.new_zeros((len(matches), heads, width, dim), device=device)
            for i, m in enumerate(matches):
                if m is not None:
                    out[i, :, width - m.length :] = getattr(m, part)[layer]
            stacked.append(out)
        layers.append((stacked[0], stacked[1]))
    return DynamicCache(ddp_cache_data=layers, config=config)


def row_kv(
    cache: Any, mask: torch.Tensor, row: int, length: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Copies of the keys and values of the first ``length`` tokens of ``row`` (its columns
    with mask 1, in order), one ``[kv heads, length, head dim]`` tensor per layer."""
    columns = mask[row].nonzero()[:length, 0]
    if columns.numel() != length:
        raise ValueError(f"row {row} has {columns.numel()} tokens in the cache, not {length}")
    keys, values = [], []
    for layer in cache_layers(cache):
        keys.append(layer.keys[row].index_select(-2, columns))
        values.append(layer.values[row].index_select(-2, columns))
    return keys, values


def store_shared_prefixes(
    cache: PrefixCache,
    sequences: Sequence[list[int]],
    cached: Sequence[int],
    kv: Any,
    mask: torch.Tensor,
) -> None:
    """Store the prefix each just-prefilled sequence shares with recent prompts
    (:meth:`PrefixCache.observe`) when it is longer than what the row reused, copied out of this
    prefill's cache ``kv`` (causal attention makes it the prefix's own KV)."""
    for i, sequence in enumerate(sequences):
        shared = cache.observe(sequence)
        if shared > cached[i] and cache.wants(sequence[:shared]):
            cache.insert(sequence[:shared], *row_kv(kv, mask, i, shared))


def store_turn(cache: PrefixCache, batch: Batch, i: int) -> None:
    """Store what row ``i`` prefilled and generated, when it ended with ``stop``: the next turn of
    its episode starts with these tokens. (Its last sampled token has no KV yet: never run.)"""
    row = batch.rows[i]
    if row.finish != "stop" or not row.tokens or not cache.enabled:
        return
    sequence = row.request.prompt_ids + row.tokens[:-1]
    if cache.wants(sequence):
        cache.insert(sequence, *row_kv(batch.cache, batch.mask, i, len(sequence)))


def join(old: Batch | None, new: Batch) -> Batch:
    """Merge newly prefilled rows into the running batch (rows stay right-aligned: the
    narrower block is left-padded with masked-out cache entries)."""
    if old is None:
        return new
    width = max(old.mask.shape[1], new.mask.shape[1])
    for a, b in zip(cache_layers(old.cache), cache_layers(new.cache), strict=True):
        a.keys = torch.cat([left_pad(a.keys, width, -2), left_pad(b.keys, width, -2)])
        a.values = torch.cat([left_pad(a.values, width, -2), left_pad(b.values, width, -2)])
    old.rows.extend(new.rows)
    old.mask = torch.cat([left_pad(old.mask, width, -1), left_pad(new.mask, width, -1)])
    old.next_pos = torch.cat([old.next_pos, new.next_pos])
    old.last = torch.cat([old.last, new.last])
    return old


def compact(batch: Batch) -> None:
    """Move every row's tokens, in order, to the right end of the batch's columns (in place), so
    that the batch is as wide as its longest row. A prefill on cached prefixes leaves padding
    between a row's prefix and the rest of its prompt, which every later decoding step would
    attend over (masked out, but computed and copied).

    >>> from types import SimpleNamespace as NS
    >>> keys = torch.arange(4.0).expand(2, 1, 4)[..., None]  # column c holds c
    >>> layer = NS(keys=keys, values=keys.clone())
    >>> mask = torch.tensor([[1, 1, 0, 1], [0, 0, 1, 1]])
    >>> batch = Batch([], NS(layers=[layer]), mask, torch.zeros(2, 1), torch.zeros(2, 5))
    >>> compact(batch)
    >>> batch.mask.tolist(), layer.keys[:, 0, :, 0].tolist()
    ([[1, 1, 1], [0, 1, 1]], [[0.0, 1.0, 3.0], [1.0, 2.0, 3.0]])
    """
    width = int(batch.mask.sum(-1).max())
    if width == batch.mask.shape[1]:
        return
    # a stable sort puts each row's padding columns first and its tokens last, each in order
    columns = torch.sort(batch.mask, dim=-1, stable=True).indices[:, -width:]
    batch.mask = batch.mask.gather(-1, columns)
    for layer in cache_layers(batch.cache):
        heads, dim = layer.keys.shape[1], layer.keys.shape[-1]
        index = columns[:, None, :, None].expand(-1, heads, -1, dim)
        layer.keys = layer.keys.gather(2, index)
        layer.values = layer.values.gather(2, index)


def keep_rows(batch: Batch, keep: torch.Tensor) -> None:
    """Keep only the rows at indices ``keep`` (in place), and drop the leading columns no
    remaining row uses."""
    batch.rows = [batch.rows[i] for i in keep.tolist()]
    mask = batch.mask[keep]
    start = int((mask.sum(0) > 0).nonzero()[0])
    batch.mask = mask[:, start:]
    for layer in cache_layers(batch.cache):
        layer.keys = layer.keys[keep, :, start:]
        layer.values = layer.values[keep, :, start:]
    batch.next_pos = batch.next_pos[keep]
    batch.last = batch.last[keep]
