"""Automatic prefix caching for the built-in engine: the KV cache of prompt prefixes seen before.

Requests to one server share long prompt prefixes: every episode of an environment starts with
the same system prompt and tool schemas (rendered by the chat template), the episodes of a GRPO
group share their whole task prompt, and the next turn of an episode starts with everything the
previous turn prefilled and generated. Causal attention makes the keys and values of a prefix a
function of the prefix alone (masked padding around it changes nothing), so they can be kept
from one prefill and reused by any later prompt that starts with the same tokens.

:class:`PrefixCache` keeps such prefixes, each as its tokens and per-layer keys and values, in a
small LRU bounded in bytes and in entries. The engine asks it for the longest cached prefix of a
new prompt (:meth:`PrefixCache.match`) and prefills only the rest; it offers two kinds of
prefixes to store:

* **shared prompt prefixes** — the longest common prefix of a newly prefilled prompt with the
  prompts seen recently (:meth:`PrefixCache.observe` keeps their tokens only), when it is at
  least ``min_tokens`` long: the system prompt once a second episode arrives, a group's task
  prompt once a second member arrives;
* **finished turns** — prompt plus generated tokens of a row that ended with ``stop``: the next
  turn of that episode starts with them.

An entry that is a prefix of a new one is dropped (the longer entry answers every lookup the
shorter one did), and a new entry already contained in one held is not stored twice. Entries are
only valid for the weights that computed them: the engine calls :meth:`PrefixCache.clear` on
every weight update.

>>> import torch
>>> cache = PrefixCache(max_bytes=2**20, min_tokens=4)
>>> kv = [torch.zeros(1, 6, 2)]  # one layer: [kv heads, tokens, head dim]
>>> cache.observe([1, 2, 3, 4, 5, 6])  # nothing seen before
0
>>> cache.observe([1, 2, 3, 4, 9])  # shares 4 tokens with the prompt before
4
>>> cache.insert([1, 2, 3, 4, 5, 6], kv, kv)
True
>>> m = cache.match([1, 2, 3, 4, 5, 7, 8], limit=6)
>>> m.length, tuple(m.keys[0].shape)
(5, (1, 5, 2))
>>> cache.match([1, 2, 3, 9], limit=3) is None  # shorter than min_tokens
True
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_PREFIX_CACHE_MB",
    "PrefixCache",
    "PrefixMatch",
    "common_prefix_length",
    "shared_prefix",
]

DEFAULT_PREFIX_CACHE_MB = 512.0
"""The engine's default budget (``--prefix-cache-mb``): about 25 turns of 480 tokens of
SmolLM2-135M in float32, whose keys and values take 45 KiB per token."""

Tokens = tuple[int, ...]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    A binary search over slice comparisons (each done in C), so a 400-token prompt costs about
    nine comparisons rather than 400 steps of a Python loop.

    >>> common_prefix_length((1, 2, 3, 4), (1, 2, 9))
    2
    >>> common_prefix_length([5, 6], [5, 6, 7])
    2
    """
    a, b = tuple(a), tuple(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo] holds; a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def shared_prefix(
    prompts: Sequence[Sequence[int]],
    min_tokens: int,
    cached: Callable[[Tokens], int] = lambda prefix: 0,
) -> Tokens | None:
    """The prefix that two or more of ``prompts`` share and that saves the most prefill when it
    is computed once: ``(count - 1) * (length - cached(prefix))`` tokens, where ``cached`` says
    how much of it is in the cache already. None when no such prefix has at least
    ``min_tokens`` uncached tokens.

    >>> system = (7,) * 40
    >>> shared_prefix([system + (1, 2), system + (1, 3), system + (4,), (9, 9)], 32) == system
    True
    >>> len(shared_prefix([system + (1, 2)] * 3 + [system + (4,)], 32))  # 3 x 40 > 2 x 42
    40
    >>> shared_prefix([system + (1, 2)] * 3 + [system + (4,)], 32, lambda p: 40) is None
    True
    >>> len(shared_prefix([system + (1, 2)] * 3 + [(5,) * 50], 32))  # three identical prompts
    42
    >>> shared_prefix([system + (1,), system + (2,)], 32, lambda p: 30) is None  # 10 uncached
    True
    """
    keys = sorted(tuple(p) for p in prompts)
    lengths = {common_prefix_length(a, b) for a, b in itertools.pairwise(keys)}
    best, saving = None, 0
    for n in sorted(lengths, reverse=True):
        if n < min_tokens:
            continue
        for prefix in {k[:n] for k in keys}:
            count = sum(1 for k in keys if k[:n] == prefix)
            if count < 2 or (count - 1) * n <= saving:
                continue  # not shared, or cannot beat the best even when nothing is cached
            new = n - min(cached(prefix), n)
            if new >= min_tokens and (count - 1) * new > saving:
                best, saving = prefix, (count - 1) * new
    return best


@dataclass(frozen=True)
class PrefixMatch:
    """The cached keys and values of a prompt's first ``length`` tokens."""

    length: int
    keys: tuple[torch.Tensor, ...]
    """One tensor per layer, ``[kv heads, length, head dim]`` (views of the cache's entry)."""
    values: tuple[torch.Tensor, ...]


@dataclass
class _Entry:
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    nbytes: int


class PrefixCache:
    """An LRU of token prefixes and their per-layer KV cache (see the module doc).

    Args:
        max_bytes: the most bytes of keys and values held; 0 disables the cache (every lookup
            misses, nothing is stored or remembered).
        min_tokens: the shortest prefix worth storing or reusing.
        max_entries: the most prefixes held (each lookup compares against all of them).
        history: how many recent prompts :meth:`observe` compares a new prompt with.

    Thread-safe; the engine's scheduler thread does the lookups and inserts, and a weight
    update (another thread, while the scheduler is paused) clears it.
    """

    def __init__(
        self,
        max_bytes: int,
        *,
        min_tokens: int = 32,
        max_entries: int = 64,
        history: int = 64,
    ) -> None:
        if max_bytes < 0 or min_tokens < 1 or max_entries < 1 or history < 0:
            raise ValueError(
                f"PrefixCache(max_bytes={max_bytes}, min_tokens={min_tokens}, max_entries="
                f"{max_entries}, history={history}): sizes must be >= 0 (min_tokens, "
                "max_entries >= 1)"
            )
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.max_entries = max_entries
        self._entries: OrderedDict[Tokens, _Entry] = OrderedDict()  # least recently used first
        self._recent: deque[Tokens] = deque(maxlen=history)
        self._bytes = 0
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("lookups", "hits", "looked_up_tokens", "reused_tokens", "stored", "evicted"), 0
        )

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def match(self, tokens: Sequence[int], limit: int) -> PrefixMatch | None:
        """The longest cached prefix of ``tokens``, cut to at most ``limit`` tokens (the engine
        passes ``len(prompt) - 1``: at least one token is prefilled, for its logits), or None
        when it is shorter than ``min_tokens``. A hit makes the entry the most recently used.
        """
        if not self.enabled:
            return None
        key = tuple(tokens)
        with self._lock:
            self._counts["lookups"] += 1
            self._counts["looked_up_tokens"] += len(key)
            best, best_len = None, 0
            for held in reversed(self._entries):  # ties go to the most recently used
                n = common_prefix_length(held, key)
                if n > best_len:
                    best, best_len = held, n
            length = min(best_len, limit)
            if best is None or length < self.min_tokens:
                return None
            entry = self._entries[best]
            self._entries.move_to_end(best)
            self._counts["hits"] += 1
            self._counts["reused_tokens"] += length
            return PrefixMatch(
                length,
                tuple(k[:, :length] for k in entry.keys),
                tuple(v[:, :length] for v in entry.values),
            )

    def cached_length(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` the cache holds (no counters, no LRU touch)."""
        key = tuple(tokens)
        with self._lock:
            return max((common_prefix_length(held, key) for held in self._entries), default=0)

    def observe(self, tokens: Sequence[int]) -> int:
        """Remember ``tokens`` (a prompt just prefilled) and return the longest prefix it
        shares with the prompts remembered before it (0 when the cache is disabled)."""
        if not self.enabled:
            return 0
        key = tuple(tokens)
        with self._lock:
            shared = max((common_prefix_length(seen, key) for seen in self._recent), default=0)
            self._recent.append(key)
        return shared

    def wants(self, tokens: Sequence[int]) -> bool:
        """Whether :meth:`insert` would store ``tokens`` (long enough, not already held as
        itself or inside a longer entry); lets the caller skip copying the KV otherwise."""
        if not self.enabled or len(tokens) < self.min_tokens:
            return False
        key = tuple(tokens)
        with self._lock:
            return self._holder(key) is None

    def insert(
        self, tokens: Sequence[int], keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]
    ) -> bool:
        """Store the KV of ``tokens`` (one ``[kv heads, len(tokens), head dim]`` tensor per
        layer; the cache keeps these tensors, so pass copies). Returns whether it was stored:
        not when too short, too large for the budget, or already held."""
        key = tuple(tokens)
        if not self.enabled or len(key) < self.min_tokens:
            return False
        if any(t.shape[-2] != len(key) for t in (*keys, *values)):
            raise ValueError(f"KV of {len(key)} tokens expected, got shapes {keys[0].shape}")
        nbytes = sum(t.numel() * t.element_size() for t in (*keys, *values))
        if nbytes > self.max_bytes:
            return False
        with self._lock:
            holder = self._holder(key)
            if holder is not None:
                self._entries.move_to_end(holder)
                return False
            for held in [h for h in self._entries if key[: len(h)] == h]:  # now contained in key
                self._bytes -= self._entries.pop(held).nbytes
            self._entries[key] = _Entry(tuple(keys), tuple(values), nbytes)
            self._bytes += nbytes
            self._counts["stored"] += 1
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self._counts["evicted"] += 1
        return True

    def clear(self) -> None:
        """Drop every entry and the remembered prompts (the weights changed)."""
        with self._lock:
            self._entries.clear()
            self._recent.clear()
            self._bytes = 0

    def stats(self) -> dict[str, Any]:
        """Counters since start and what is held now (entries, bytes).

        The counters: ``lookups`` and ``hits`` of :meth:`match`, the tokens looked up (every
        prefill's, including a prefix shared by rows admitted together and prefilled once) and
        those reused from the cache — their difference is the tokens prefilled — and the entries
        stored and evicted."""
        with self._lock:
            return {
                **self._counts,
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
            }

    def _holder(self, key: Tokens) -> Tokens | None:
        """An entry that starts with ``key`` (so holds its KV), if any; the lock is held."""
        n = len(key)
        return next((h for h in self._entries if len(h) >= n and h[:n] == key), None)
