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
Log-probabilities are those of the raw model distribution (before temperature and top-p), as
vLLM reports them by default.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from areal_agents.errors import ConfigError, WeightSyncError
from areal_agents.serving.adapters import AdapterMerger

__all__ = ["Engine", "GenerationRequest", "GenerationResult"]

logger = logging.getLogger(__name__)


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
class _Row:
    request: GenerationRequest
    future: Future[GenerationResult]
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Batch:
    """The running batch: its rows, their KV cache and attention mask (right-aligned rows),
    the next position of each row and the logits of its next token (not yet sampled)."""

    rows: list[_Row]
    cache: Any
    mask: torch.Tensor
    next_pos: torch.Tensor
    last: torch.Tensor


def _cache_layers(cache: Any) -> list[Any]:
    """The per-layer key/value holders of a transformers ``DynamicCache``."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"continuous batching needs a DynamicCache, got {type(cache).__name__}")
    return list(layers)


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad ``t`` at the start of ``dim`` to ``width`` entries."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class Engine:
    """A causal LM with continuous batching, pause/resume and in-place weight updates."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "float32",
        max_model_len: int = 2048,
        max_batch_size: int = 16,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

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
        self._queue: deque[_Row] = deque()
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

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        """Queue ``request``; the future resolves when its generation ends."""
        if len(request.prompt_ids) + request.max_tokens > self.max_model_len:
            raise ConfigError(
                f"this model's maximum context length is {self.max_model_len} tokens; the "
                f"request has {len(request.prompt_ids)} prompt tokens and max_tokens="
                f"{request.max_tokens}"
            )
        bad = [t for t in request.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ConfigError(f"token id {bad[0]} is out of range [0, {self.vocab_size})")
        seed = request.seed if request.seed is not None else next(self._seeds)
        generator = torch.Generator(device="cpu").manual_seed(int(seed))
        row = _Row(request=request, future=Future(), generator=generator)
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
                    params[name].copy_(tensor.to(params[name].device, params[name].dtype))
            self._version = int(version)
        finally:
            if not was_paused:
                self.resume()

    def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Load every ``*.safetensors`` file of an HF checkpoint directory (or one file)."""
        from safetensors.torch import load_file

        path = Path(path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise WeightSyncError(f"no safetensors weights at {path}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        self.update_weights(state, version)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._abort.set()
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ---- the scheduler thread ------------------------------------------------------------

    def _loop(self) -> None:
        state: _Batch | None = None
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
                new: list[_Row] = []
                if not self._paused:
                    room = self.max_batch_size - (len(state.rows) if state else 0)
                    new = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
                self._busy = True
            try:
                if new:
                    state = self._join(state, self._prefill(new))
                    new = []
                if state is not None:
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

    @torch.no_grad()
    def _prefill(self, rows: list[_Row]) -> _Batch:
        """Run the prompts of newly admitted rows; returns them as a batch ready to sample."""
        prompts = [r.request.prompt_ids + list(r.request.forced_prefix) for r in rows]
        for row in rows:  # forced tokens are part of the output, with their logprobs below
            row.tokens.extend(row.request.forced_prefix)
            for token in row.request.forced_prefix:
                self._notify(row, token)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        forced = [len(r.request.forced_prefix) for r in rows]
        keep = max(forced) + 1
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
        )
        logits = out.logits.float()
        for i, row in enumerate(rows):  # logprobs of forced tokens (mask 1 in training too)
            n = forced[i]
            if n:
                lp = torch.log_softmax(logits[i, keep - 1 - n : keep - 1], dim=-1)
                picked = torch.tensor(row.request.forced_prefix, device=lp.device)
                row.logprobs.extend(lp.gather(-1, picked[:, None])[:, 0].tolist())
                row.top.extend(self._top(lp[j], row.request.top_logprobs) for j in range(n))
        return _Batch(rows, out.past_key_values, mask, positions[:, -1:] + 1, logits[:, -1, :])

    def _join(self, old: _Batch | None, new: _Batch) -> _Batch:
        """Merge newly prefilled rows into the running batch (rows stay right-aligned: the
        shorter block is left-padded with masked-out cache entries)."""
        if old is None:
            return new
        width = max(old.mask.shape[1], new.mask.shape[1])
        for a, b in zip(_cache_layers(old.cache), _cache_layers(new.cache), strict=True):
            a.keys = torch.cat([_left_pad(a.keys, width, -2), _left_pad(b.keys, width, -2)])
            a.values = torch.cat([_left_pad(a.values, width, -2), _left_pad(b.values, width, -2)])
        old.rows.extend(new.rows)
        old.mask = torch.cat([_left_pad(old.mask, width, -1), _left_pad(new.mask, width, -1)])
        old.next_pos = torch.cat([old.next_pos, new.next_pos])
        old.last = torch.cat([old.last, new.last])
        return old

    @torch.no_grad()
    def _step(self, batch: _Batch) -> _Batch | None:
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
        if len(done) == len(batch.rows):
            return None
        if done:
            keep = torch.tensor(
                [i for i, r in enumerate(batch.rows) if r.finish is None], device=self.device
            )
            batch.rows = [r for r in batch.rows if r.finish is None]
            mask = batch.mask[keep]
            start = int((mask.sum(0) > 0).nonzero()[0])  # drop columns no remaining row uses
            batch.mask = mask[:, start:]
            for layer in _cache_layers(batch.cache):
                layer.keys = layer.keys[keep, :, start:]
                layer.values = layer.values[keep, :, start:]
            batch.next_pos, chosen = batch.next_pos[keep], chosen[keep]
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

    def _resolve(self, row: _Row) -> None:
        row.future.set_result(
            GenerationResult(
                token_ids=row.tokens,
                logprobs=row.logprobs,
                top_logprobs=row.top,
                finish_reason=row.finish or "abort",
                stop_reason=row.stop_reason,
                weight_version=self._version,
            )
        )

    def _sample(self, rows: Sequence[_Row], logits: torch.Tensor) -> torch.Tensor:
        """Sample one token per unfinished row, record it, and decide whether the row is done."""
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = torch.full((len(rows),), self.pad_token_id, dtype=torch.long)
        for i, row in enumerate(rows):
            if row.finish is not None:
                continue
            req = row.request
            if req.cancelled:  # the row leaves the batch before the next decoding step
                row.finish = "abort"
                continue
            token = self._pick(logits[i], req.temperature, req.top_p, row.generator)
            chosen[i] = token
            row.tokens.append(token)
            self._notify(row, token)
            row.logprobs.append(float(logprobs[i, token]))
            if req.top_logprobs:
                row.top.append(self._top(logprobs[i], req.top_logprobs))
            self._check_done(row, token)
        return chosen.to(logits.device)

    @staticmethod
    def _notify(row: _Row, token: int) -> None:
        callback = row.request.on_token
        if callback is None:
            return
        try:
            callback(token)
        except Exception:  # a listener that went away (client gone) must not stop the batch
            logger.debug("on_token failed; no more tokens are reported", exc_info=True)
            row.request.on_token = None

    @staticmethod
    def _top(logprobs: torch.Tensor, k: int) -> list[tuple[int, float]]:
        if k <= 0:
            return []
        values, indices = logprobs.topk(k)
        return list(zip(indices.tolist(), values.tolist(), strict=True))

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
        if temperature <= 0.0:
            return int(logits.argmax())
        probs = torch.softmax(logits.double().cpu() / temperature, dim=-1)
        if top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            cumulative = sorted_p.cumsum(-1)
            drop = cumulative - sorted_p >= top_p  # keep the smallest set reaching top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=gen))

    def _check_done(self, row: _Row, token: int) -> None:
        req = row.request
        if token in self.eos_token_ids and not req.ignore_eos:
            row.finish = "stop"
        elif token in req.stop_token_ids:
            row.finish, row.stop_reason = "stop", token
        elif req.stop:
            tail = self.tokenizer.decode(row.tokens[-16:], skip_special_tokens=False)
            for s in req.stop:
                if s in tail:
                    row.finish, row.stop_reason = "stop", s
                    break
        if row.finish is None and len(row.tokens) >= req.max_tokens:
            row.finish = "length"
