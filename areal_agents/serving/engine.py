"""The built-in inference engine: a transformers causal LM behind a continuous-batching scheduler.

One scheduler thread owns the model and runs one running batch. Each step it admits waiting
requests (up to ``max_batch_size`` rows in all: their prompts are prefilled and their KV cache
joins the batch's, rows kept right-aligned), samples one token per row with the row's own
temperature, top-p and random generator, hands back every row that has finished
(end-of-sequence, stop token or string, ``max_tokens``) at once, drops it from the cache, and
decodes the remaining rows one step. A short request therefore never waits for a long one, and
a request arriving mid-generation joins the batch at the next step.

transformers' own continuous batching (``generate_batch``) was considered and not used: it
applies one generation config to every request (no per-request temperature or seed) and cannot
be interrupted at a step boundary, and both are needed here — the second for RL weight updates:
:meth:`Engine.pause` makes an in-flight batch stop at the next step and return what it has with
``finish_reason="abort"`` (vLLM's reason for an aborted request), so a client can continue the
generation under the new weights. Requests that arrive while paused wait for :meth:`resume`.

Every result carries the weight version that produced it; weights are replaced only while no
row is running (after :meth:`Engine.pause`), so one result never mixes versions.

This module holds the engine's public API, its weight updates and the scheduler loop (admitting
rows, decoding steps). The work on rows it inherits from
:class:`~areal_agents.serving.engine_rows.RowWork`: prefill on cached prompt prefixes, sampling
and the log-probs reported (:mod:`areal_agents.serving.engine_rows`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from areal_agents.errors import ConfigError, WeightSyncError
from areal_agents.serving.adapters import AdapterMerger
from areal_agents.serving.base import LOGPROBS_MODES
from areal_agents.serving.batch import (
    Batch,
    GenerationRequest,
    GenerationResult,
    Row,
    join,
    keep_rows,
    store_turn,
)
from areal_agents.serving.engine_rows import RowWork
from areal_agents.serving.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from areal_agents.serving.staging import checkpoint_tensors, copy_into

__all__ = ["Engine", "GenerationRequest", "GenerationResult"]

logger = logging.getLogger(__name__)


class Engine(RowWork):
    """A causal LM with continuous batching, pause/resume and in-place weight updates.

    Prefill and sampling of its rows come from :class:`~areal_agents.serving.engine_rows.RowWork`.
    ``prefix_cache_mb`` bounds the keys and values of prompt prefixes kept for reuse (see
    :mod:`areal_agents.serving.prefix_cache`); 0 disables prefix caching.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "float32",
        max_model_len: int = 2048,
        max_batch_size: int = 16,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
        logprobs_mode: str = "raw_logprobs",
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(
                f"logprobs_mode={logprobs_mode!r}: choose {' or '.join(LOGPROBS_MODES)}"
            )
        self.logprobs_mode = logprobs_mode
        """``raw_logprobs`` (the model's, vLLM's default) or ``processed_logprobs`` (the
        distribution each token was drawn from: temperature and top-p applied)."""

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model_path = str(model_path)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(self.model_path)
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ConfigError(f"dtype={dtype!r}: use float32, bfloat16 or float16")
        model: Any = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype)
        self.model: Any = model.to(self.device).eval()
        limit = int(getattr(self.model.config, "max_position_embeddings", max_model_len))
        self.max_model_len = min(max_model_len, limit)
        self.max_batch_size = max_batch_size
        eos = self.model.generation_config.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        if self.tokenizer.eos_token_id is not None:
            eos_ids.append(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(int(i) for i in eos_ids if i is not None)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else min(self.eos_token_ids))
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self._version = 0
        self._adapter = AdapterMerger()  # the base weights under a LoRA adapter
        self.decode_steps = 0
        """Forward passes run so far (a progress counter for monitoring and tests)."""
        self._seconds = dict.fromkeys(
            ("prefill_s", "prefill_cpu_s", "decode_s", "decode_cpu_s"), 0.0
        )
        if prefix_cache_mb < 0:
            raise ConfigError(f"prefix_cache_mb={prefix_cache_mb}: must be >= 0 (0 disables)")
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20))
        """Prompt prefixes whose KV cache is reused (:meth:`PrefixCache.stats` for its counters)."""
        self._prefix_checked = False  # whether the model's cache layers were checked reusable
        self._prefix_version = 0  # the weight version the prefix cache's entries belong to
        self._queue: deque[Row] = deque()
        self._cond = threading.Condition()
        self._paused = False
        self._busy = False
        self._active = False
        self._abort = threading.Event()
        self._closed = False
        self._seeds = itertools.count(int(time.time_ns() % 1_000_003))
        self._thread = threading.Thread(target=self._loop, name="areal-engine", daemon=True)
        self._thread.start()

    # ---- public API ----------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def is_paused(self) -> bool:
        return self._paused

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring: decoding steps; seconds spent prefilling and decoding, in
        wall time and in CPU time of the scheduler thread (all of the engine's compute when
        torch runs one thread); the prefix cache's counters (:meth:`PrefixCache.stats`)."""
        seconds = {k: round(v, 3) for k, v in self._seconds.items()}
        return {
            "decode_steps": self.decode_steps,
            **seconds,
            "prefix_cache": self.prefix_cache.stats(),
        }

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        """Queue ``request``; the future resolves when its generation ends."""
        if len(request.prompt_ids) + request.max_tokens > self.max_model_len:
            raise ConfigError(
                f"this model's maximum context length is {self.max_model_len} tokens; the "
                f"request has {len(request.prompt_ids)} prompt tokens and max_tokens="
                f"{request.max_tokens}"
            )
        stops = request.stop_token_ids
        for what, ids in (("token id", request.prompt_ids), ("stop_token_ids: token id", stops)):
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ConfigError(f"{what} {bad[0]} is out of range [0, {self.vocab_size})")
        seed = request.seed if request.seed is not None else next(self._seeds)
        generator = torch.Generator(device="cpu").manual_seed(int(seed))
        row = Row(request=request, future=Future(), generator=generator)
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._queue.append(row)
            self._cond.notify_all()
        return row.future

    def pause(self) -> None:
        """Stop generating: the running batch ends at the next step with ``finish_reason=abort``."""
        with self._cond:
            self._paused = True
            self._abort.set()
            self._cond.notify_all()
            while self._busy or self._active:
                self._cond.wait()
            self._abort.clear()

    def resume(self) -> None:
        """Start generating again (queued requests run)."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the model's weights in place (all names and shapes checked first)."""
        self._replace(state, version)
        self._adapter.forget()  # these weights are the base of any later adapter

    def update_adapter(
        self, adapter: Mapping[str, torch.Tensor], scaling: float, version: int
    ) -> None:
        """Serve the base weights plus the LoRA ``adapter`` (PEFT names, see
        :mod:`areal_agents.serving.adapters`) as ``version``; the previous adapter is replaced."""
        if not adapter:
            raise WeightSyncError("no tensors in the adapter update")
        weights = dict(self.model.state_dict())
        merged = self._adapter.merged(weights, adapter, scaling)
        self._replace(merged, version)

    def _replace(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        # state_dict names include tied aliases (lm_head.weight of a tied model), as trainers send.
        params: dict[str, torch.Tensor] = dict(self.model.state_dict(keep_vars=True))
        problems = []
        for name, tensor in state.items():
            target = params.get(name)
            if target is None:
                problems.append(f"unknown tensor {name!r}")
            elif tuple(target.shape) != tuple(tensor.shape):
                problems.append(f"{name}: shape {tuple(tensor.shape)} != {tuple(target.shape)}")
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise WeightSyncError("weights do not fit the model: " + "; ".join(problems[:3]) + more)
        if not state:
            raise WeightSyncError("no tensors in the weight update")
        if version <= self._version:
            raise WeightSyncError(
                f"weight version must increase: got {version}, serving {self._version}"
            )
        was_paused = self._paused
        self.pause()
        try:
            with torch.no_grad():
                for name, tensor in state.items():
                    copy_into(params[name], tensor)
            self._version = int(version)
        finally:
            self.prefix_cache.clear()  # KV computed by the old weights (even on a partial copy)
            if not was_paused:
                self.resume()

    def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Load every ``*.safetensors`` file of an HF checkpoint directory (or one file): each
        tensor is a view of the mapped file, copied once into its parameter."""
        self.update_weights(checkpoint_tensors(path), version)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._abort.set()
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ---- the scheduler thread ------------------------------------------------------------

    def _loop(self) -> None:
        state: Batch | None = None
        while True:
            with self._cond:
                while not self._closed and state is None and (self._paused or not self._queue):
                    self._cond.wait()
                if self._closed:
                    rows = [*self._queue, *(state.rows if state else [])]
                    for row in rows:
                        if not row.future.done():
                            row.future.set_exception(RuntimeError("the engine was closed"))
                    return
                new: list[Row] = []
                if not self._paused:
                    room = self.max_batch_size - (len(state.rows) if state else 0)
                    new = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
                self._busy = True
            for row in [r for r in new if r.request.cancelled]:  # its client is gone: no prefill
                row.finish = "abort"
                self._resolve(row)
                new.remove(row)
            try:
                if new:
                    with self._timed("prefill"):
                        state = join(state, self._prefill(new))
                    new = []
                if state is not None:
                    with self._timed("decode"):
                        state = self._step(state)
            except Exception as e:  # a bug or OOM: fail these requests, keep serving
                logger.exception("generation failed")
                for row in [*new, *(state.rows if state else [])]:
                    if not row.future.done():
                        row.future.set_exception(e)
                state = None
            finally:
                with self._cond:
                    self._busy = False
                    self._active = state is not None
                    self._cond.notify_all()

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self._seconds[f"{phase}_s"] += time.perf_counter() - wall
            self._seconds[f"{phase}_cpu_s"] += time.thread_time() - cpu

    @torch.no_grad()
    def _step(self, batch: Batch) -> Batch | None:
        """Sample one token per row, hand back finished rows at once, decode the rest one step.

        Returns the batch still running (None when every row has finished or was aborted).
        """
        chosen = self._sample(batch.rows, batch.last)
        if self._abort.is_set():
            for row in batch.rows:
                if row.finish is None:
                    row.finish = "abort"
        done = [i for i, r in enumerate(batch.rows) if r.finish is not None]
        for i in done:
            self._resolve(batch.rows[i])
            store_turn(self.prefix_cache, batch, i)  # the next turn starts with it
        if len(done) == len(batch.rows):
            return None
        if done:
            keep = torch.tensor(
                [i for i, r in enumerate(batch.rows) if r.finish is None], device=self.device
            )
            keep_rows(batch, keep)
            chosen = chosen[keep]
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=-1)
        out = self.model(
            input_ids=chosen[:, None],
            attention_mask=batch.mask,
            position_ids=batch.next_pos,
            past_key_values=batch.cache,
            use_cache=True,
        )
        batch.cache = out.past_key_values
        batch.last = out.logits[:, -1, :].float()
        batch.next_pos = batch.next_pos + 1
        self.decode_steps += 1
        return batch
