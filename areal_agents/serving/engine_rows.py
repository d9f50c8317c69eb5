"""The built-in engine's work on its rows: prefill on cached prompt prefixes, and sampling.

:class:`RowWork` holds what :class:`~areal_agents.serving.engine.Engine`'s scheduler thread does
with the model for the rows it admits and decodes: prefilling newly admitted prompts (as one
batch, ready to sample), sampling each unfinished row's next token with the log-probs it
reports, telling a streaming listener each token, and resolving a finished row's future. The
engine itself (:mod:`areal_agents.serving.engine`) holds the public API, the weight updates and
the scheduler loop that runs these; it inherits them from :class:`RowWork`.

Prompts that start with tokens prefilled before (the system prompt and tool schemas every
episode shares, a GRPO group's task prompt, the previous turn of an episode) prefill only the
rest, on top of the cached keys and values of that prefix; what is stored, when, and the bounds
are described in :mod:`areal_agents.serving.prefix_cache`. Results are the same as without the
cache up to floating-point noise (matrices of other shapes sum in another order). Every weight
update empties that cache: KV computed by the old weights is never reused.

Log-probabilities are those of the raw model distribution (before temperature and top-p), as
vLLM reports them by default (:mod:`areal_agents.serving.sampling`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from areal_agents.serving.batch import (
    Batch,
    GenerationRequest,
    GenerationResult,
    Row,
    compact,
    join,
    prefill_groups,
    prefill_inputs,
    reusable,
    row_kv,
    stack_prefixes,
    store_shared_prefixes,
)
from areal_agents.serving.prefix_cache import PrefixCache, PrefixMatch, shared_prefix
from areal_agents.serving.sampling import (
    check_done,
    draw,
    pick,
    sampling_logprobs,
    top_logprobs,
)

__all__ = ["RowWork"]

logger = logging.getLogger(__name__)


class RowWork:
    """Prefill and sampling for the rows of :class:`~areal_agents.serving.engine.Engine`.

    A mixin: it has no state of its own and works on the attributes declared below, which the
    engine sets up. Every method runs on the engine's scheduler thread.
    """

    model: Any
    tokenizer: Any
    device: torch.device
    pad_token_id: int
    eos_token_ids: frozenset[int]
    logprobs_mode: str
    prefix_cache: PrefixCache
    _version: int  # the weight version being served
    _prefix_checked: bool  # whether the model's cache layers were checked reusable
    _prefix_version: int  # the weight version the prefix cache's entries belong to

    # ---- prefill -------------------------------------------------------------------------

    @torch.no_grad()
    def _prefill(self, rows: list[Row]) -> Batch:
        """Run the prompts of newly admitted rows; returns them as a batch ready to sample.

        A row whose prompt starts with a cached prefix prefills only the rest, on top of the
        prefix's keys and values (at least its last prompt token is always run, for logits).
        Rows that prefill very different numbers of tokens run in separate forward passes.
        """
        for row in rows:  # forced tokens are part of the output, with their logprobs below
            row.tokens.extend(row.request.forced_prefix)
            for token in row.request.forced_prefix:
                self._notify(row, token)
        if self._prefix_version != self._version:  # belt and braces: _replace clears it too
            self.prefix_cache.clear()
            self._prefix_version = self._version
        if len(rows) > 1:
            self._prefill_shared_prefix([r.request.prompt_ids for r in rows])
        matches = [self._match(r.request.prompt_ids) for r in rows]
        todo = [
            len(r.request.prompt_ids) + len(r.request.forced_prefix) - (m.length if m else 0)
            for r, m in zip(rows, matches, strict=True)
        ]
        batch = None
        for group in prefill_groups(todo):
            part = self._prefill_rows([rows[i] for i in group], [matches[i] for i in group])
            batch = join(batch, part)
        assert batch is not None
        return batch

    def _prefill_rows(self, rows: list[Row], matches: list[PrefixMatch | None]) -> Batch:
        """One forward pass over ``rows`` on top of their cached prefixes ``matches``."""
        prompts = [r.request.prompt_ids + list(r.request.forced_prefix) for r in rows]
        forced = [len(r.request.forced_prefix) for r in rows]
        keep = max(forced) + 1
        out, mask, positions = self._forward(prompts, matches, keep)
        logits = out.logits.float()
        for i, row in enumerate(rows):  # logprobs of forced tokens (mask 1 in training too)
            n = forced[i]
            if n:
                lp = self._logprobs(row.request, logits[i, keep - 1 - n : keep - 1])
                picked = torch.tensor(row.request.forced_prefix, device=lp.device)
                row.logprobs.extend(lp.gather(-1, picked[:, None])[:, 0].tolist())
                row.top.extend(top_logprobs(lp[j], row.request.top_logprobs) for j in range(n))
        if self.prefix_cache.enabled and self._reusable(out.past_key_values):
            cached = [m.length if m is not None else 0 for m in matches]
            store_shared_prefixes(self.prefix_cache, prompts, cached, out.past_key_values, mask)
        batch = Batch(rows, out.past_key_values, mask, positions[:, -1:] + 1, logits[:, -1, :])
        if any(m is not None for m in matches):
            compact(batch)  # no padding between prefixes and the rest for decoding to attend over
        return batch

    def _forward(
        self, sequences: list[list[int]], matches: list[PrefixMatch | None], keep: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """One prefill forward pass over ``sequences`` on top of their cached prefixes (logits
        of the last ``keep`` columns); returns the model's output, the mask and positions."""
        cached = [m.length if m is not None else 0 for m in matches]
        ids, mask, positions = prefill_inputs(sequences, cached, self.pad_token_id, self.device)
        past = stack_prefixes(matches, self.model.config, self.device) if any(cached) else None
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
            logits_to_keep=keep,
        )
        return out, mask, positions

    def _match(self, prompt: list[int]) -> PrefixMatch | None:
        return self.prefix_cache.match(prompt, len(prompt) - 1)  # one token left, for logits

    def _prefill_shared_prefix(self, prompts: list[list[int]], rounds: int = 4) -> None:
        """When two or more admitted rows share a prefix that is not cached yet (the first wave
        of episodes, GRPO groups arriving together), prefill it once, alone, and store it: the
        rows' own prefill then starts from it. Up to ``rounds`` prefixes, the most saving
        first (the system prompt of all rows, then the task prompt of each group)."""
        for _ in range(rounds):
            cache = self.prefix_cache
            prefix = shared_prefix(prompts, cache.min_tokens, cache.cached_length)
            if not cache.enabled or prefix is None or not cache.wants(prefix):
                return
            tokens = list(prefix)
            out, mask, _ = self._forward([tokens], [self._match(tokens)], 1)
            if not self._reusable(out.past_key_values):
                return
            if not cache.insert(tokens, *row_kv(out.past_key_values, mask, 0, len(tokens))):
                return  # larger than the budget: another round would try the same

    def _reusable(self, cache: Any) -> bool:
        """Whether prefixes can be copied out of ``cache`` (checked once; the prefix cache is
        turned off for a model whose cache layers are not plain, e.g. a sliding window)."""
        if not self._prefix_checked:
            self._prefix_checked = True
            if not reusable(cache):
                logger.warning("this model's KV cache cannot be reused: no prefix caching")
                self.prefix_cache = PrefixCache(0)
        return self.prefix_cache.enabled

    # ---- sampling and results ------------------------------------------------------------

    def _sample(self, rows: Sequence[Row], logits: torch.Tensor) -> torch.Tensor:
        """Sample one token per unfinished row, record it, and decide whether the row is done."""
        raw = torch.log_softmax(logits, dim=-1)
        chosen = torch.full((len(rows),), self.pad_token_id, dtype=torch.long)
        for i, row in enumerate(rows):
            if row.finish is not None:
                continue
            req = row.request
            if req.cancelled:  # the row leaves the batch before the next decoding step
                row.finish = "abort"
                continue
            if self._processed(req):  # drawn from, and reported as, the same distribution
                logprobs = sampling_logprobs(logits[i], req.temperature, req.top_p)
                token = draw(logprobs, row.generator)
            else:
                token = pick(logits[i], req.temperature, req.top_p, row.generator)
                logprobs = raw[i]
            chosen[i] = token
            row.tokens.append(token)
            self._notify(row, token)
            row.logprobs.append(float(logprobs[token]))
            if req.top_logprobs:
                row.top.append(top_logprobs(logprobs, req.top_logprobs))
            check_done(row, token, self.eos_token_ids, self.tokenizer)
        return chosen.to(logits.device)

    def _processed(self, req: GenerationRequest) -> bool:
        """Whether ``req``'s log-probs are its sampling distribution's (greedy: the raw ones)."""
        return self.logprobs_mode == "processed_logprobs" and req.temperature > 0.0

    def _logprobs(self, req: GenerationRequest, logits: torch.Tensor) -> torch.Tensor:
        """The log-probs ``req`` reports for ``logits`` (``[..., vocab]``), by the mode."""
        if not self._processed(req):
            return torch.log_softmax(logits, dim=-1)
        rows = logits.reshape(-1, logits.shape[-1])
        out = [sampling_logprobs(r, req.temperature, req.top_p) for r in rows]
        return torch.stack(out).reshape(logits.shape).to(logits.device, logits.dtype)

    @staticmethod
    def _notify(row: Row, token: int) -> None:
        callback = row.request.on_token
        if callback is None:
            return
        try:
            callback(token)
        except Exception:  # a listener that went away (client gone) must not stop the batch
            logger.debug("on_token failed; no more tokens are reported", exc_info=True)
            row.request.on_token = None

    def _resolve(self, row: Row) -> None:
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
