"""The learner's forward passes: a micro-batch's token log-probs, entropies and critic values,
with the prompt prefix its rows share computed once.

In agentic RL every episode of a batch starts with the same system prompt and tool schemas,
and the policy's tokens all come after them. A micro-batch whose rows share a prefix of ``p``
tokens (:func:`shared_prefix`: at least :data:`MIN_SHARED_PREFIX`, and no longer than the
position of any row's first policy token) travels as one packed sequence

    [prefix, rest_1, ..., rest_B]        (the prefix once, then each row after it)

with per-segment position ids and a 4-D attention mask in which each rest sees the prefix and
itself causally, never another rest (:func:`pack`). The model runs once over it; the logits of
the predicted positions that follow the prefix (the prefix's last position once per row, then
each rest) are unpacked into the batch's ``[B, W - 1]`` layout. Every position the loss reads
gets exactly what the padded ``[B, W]`` batch gives (the same attention over the same tokens at
the same positions), and the gradient through the shared prefix is the sum over the rows, as
the padded batch computes it. Predicted positions before ``p - 1`` and past a row's end hold
log-prob 0 and entropy 0 (value 0): they are off the loss mask, and every consumer of these
tensors (the losses, the KL terms, the advantages, the metrics) reads them through that mask.

Why one packed forward and not the prefix's KV cache expanded to ``B`` rows: it is one
ordinary call (token ids, a 4-D mask, position ids, ``logits_to_keep``), so it works under
gradient checkpointing (transformers drops ``past_key_values`` there), keeps FSDP's one forward
per micro-batch, needs no cache internals, and serves the critic's backbone alike. Its price is
dense attention over all ``N x N`` positions (most masked); measured on the default model, one
thread, 330 shared tokens and 60-130 after them, forward and backward: 4 rows 12-16 s packed,
16-17 s with the cache, 33-42 s padded; 16 rows 30 s, 25-27 s and 85-125 s (busy machine). The
micro-batch budget bounds ``N``.

A micro-batch without such a prefix, of one row, or under an attention implementation that
takes no 4-D mask (only ``sdpa`` and ``eager`` do) runs as before: the padded batch.
``trainer.share_prompt_prefix`` switches the packing off. :func:`forwarded_tokens` is what a
micro-batch costs either way, so that the learner can plan micro-batches by the tokens
actually forwarded (``batching.plan(..., cost=...)``).

>>> from areal_agents.types import Trajectory
>>> from areal_agents.trainers.batching import collate
>>> rows = [Trajectory((*range(1, 21), 30 + i, 40 + i), (0,) * 20 + (1, 1), (0.0,) * 22,
...                    (-1,) * 20 + (0, 0), 1.0, "g") for i in range(3)]
>>> mb = collate(rows, pad_id=0)
>>> shared_prefix(mb), forwarded_tokens(mb, share=False), forwarded_tokens(mb, share=True)
(20, 66, 23)
>>> packed = pack(mb, 20)
>>> packed.input_ids.shape, packed.rows.tolist(), packed.cols.tolist()
(torch.Size([1, 23]), [0, 0, 1, 1, 2, 2], [19, 20, 19, 20, 19, 20])
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from areal_agents.trainers.algorithms import Needs
from areal_agents.trainers.batching import Batch, gather_logprobs, logprobs_and_entropy
from areal_agents.trainers.lora import adapters_disabled

__all__ = [
    "MIN_SHARED_PREFIX",
    "Packed",
    "Prepass",
    "TokenLogprobs",
    "critic_values",
    "forwarded_tokens",
    "micro_batch_cost",
    "pack",
    "position_logits",
    "prepass",
    "shared_prefix",
    "token_logprobs",
]

MIN_SHARED_PREFIX = 16
"""The shortest shared prefix worth packing a micro-batch for (shorter: the padded batch)."""

_MASKABLE = ("sdpa", "eager")  # attention implementations that apply a 4-D mask as it is


@dataclass(frozen=True)
class Packed:
    """A micro-batch as one sequence: the shared prefix once, then each row's rest.

    ``N = prefix + sum(n_i - 1 - prefix)`` input positions (a row's last token predicts
    nothing and is left out); ``K = sum(n_i - prefix)`` kept positions, one per predicted
    position of a row from ``prefix - 1`` on (the prefix's last position once for each row).
    """

    prefix: int
    rows_in_batch: int
    input_ids: Tensor  # [1, N] long
    position_ids: Tensor  # [1, N] long: 0..p-1, then p.. again for each rest
    segments: Tensor  # [N] long: -1 on the prefix, i on row i's rest
    keep: Tensor  # [K] long: the packed position whose output each kept position is
    rows: Tensor  # [K] long: its row in the micro-batch
    cols: Tensor  # [K] long: its predicted position t (in [B, W - 1])
    targets: Tensor  # [K] long: the token it predicts, sequence_ids[row, t + 1]

    @property
    def tokens(self) -> int:
        """Input positions the model runs on (``N``)."""
        return int(self.input_ids.shape[1])

    def attention_mask(self, dtype: torch.dtype) -> Tensor:
        """``[1, 1, N, N]`` additive mask (0 where a query may attend, the dtype's minimum
        elsewhere): causal, and a rest sees the prefix and itself, never another rest."""
        seg = self.segments
        pos = torch.arange(seg.shape[0], device=seg.device)
        allowed = (pos[None, :] <= pos[:, None]) & (
            (seg[None, :] == -1) | (seg[None, :] == seg[:, None])
        )  # [N, N]: query x key
        mask = torch.zeros(allowed.shape, dtype=dtype, device=seg.device)
        return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]

    def unpack(self, values: Tensor, width: int) -> Tensor:
        """Kept-position values ``[K]`` -> ``[B, width]``, 0 where nothing was kept
        (differentiable)."""
        out = values.new_zeros(self.rows_in_batch, width)
        return out.index_put((self.rows, self.cols), values)


@dataclass(frozen=True)
class TokenLogprobs:
    """What one forward of the policy gives the learner (``[B, W - 1]``, aligned with the
    batch's ``loss_mask``)."""

    logprobs: Tensor
    entropy: Tensor | None
    """None unless asked for."""
    tokens: int
    """Input positions the model ran on (``learner/forward_tokens``)."""


def _lengths(mb: Batch) -> list[int]:
    return [int(n) for n in mb.attention_mask.sum(1).tolist()]


def shared_prefix(mb: Batch, minimum: int = MIN_SHARED_PREFIX) -> int:
    """The prefix length the rows of ``mb`` can share, 0 when below ``minimum`` (or one row).

    The longest common prefix of the rows' tokens, cut to each row's first policy token (so
    that every position the loss reads follows it) and to one token before the shortest row
    ends (so that every row keeps a predicted position).
    """
    ids = mb.sequence_ids
    if ids.shape[0] < 2:
        return 0
    limit = min(_lengths(mb)) - 1
    on = mb.loss_mask > 0  # [B, W-1]: predicted position t on the mask <=> token t + 1
    rows_on = on.any(1)
    if bool(rows_on.any()):
        first = on[rows_on].int().argmax(1) + 1  # the first policy token of each such row
        limit = min(limit, int(first.min()))
    if limit < minimum:
        return 0
    same = (ids[:, :limit] == ids[:1, :limit]).all(0)  # [limit]
    p = int(same.int().cumprod(0).sum())
    return p if p >= minimum else 0


def forwarded_tokens(mb: Batch, share: bool) -> int:
    """Input positions a forward of ``mb`` runs on: packed around its shared prefix when
    ``share`` and it has one, else the padded ``B x W``."""
    p = shared_prefix(mb) if share else 0
    if not p:
        return int(mb.sequence_ids.numel())
    return p + sum(n - 1 - p for n in _lengths(mb))


def pack(mb: Batch, prefix: int, device: torch.device | None = None) -> Packed:
    """The packed sequence of ``mb`` around its first ``prefix`` tokens, which every row must
    share (:func:`shared_prefix`), on ``device`` (default: the batch's)."""
    ids = mb.sequence_ids
    lengths = _lengths(mb)
    if not 1 <= prefix <= min(lengths) - 1:
        raise ValueError(f"prefix={prefix}: must be in [1, {min(lengths) - 1}] for these rows")
    if not bool((ids[:, :prefix] == ids[:1, :prefix]).all()):
        raise ValueError(f"the rows do not share their first {prefix} tokens")
    inputs, positions = [ids[0, :prefix]], [torch.arange(prefix)]
    segments = [torch.full((prefix,), -1)]
    keep, rows, cols, targets = [], [], [], []
    offset = prefix
    for i, n in enumerate(lengths):
        rest = n - 1 - prefix  # the rest's input tokens: prefix .. n - 2
        inputs.append(ids[i, prefix : n - 1])
        positions.append(torch.arange(prefix, n - 1))
        segments.append(torch.full((rest,), i))
        keep.append(torch.cat([torch.tensor([prefix - 1]), torch.arange(offset, offset + rest)]))
        rows.append(torch.full((rest + 1,), i))
        cols.append(torch.arange(prefix - 1, n - 1))
        targets.append(ids[i, prefix:n])
        offset += rest
    dev = device if device is not None else ids.device
    return Packed(
        prefix=prefix,
        rows_in_batch=len(lengths),
        input_ids=torch.cat(inputs)[None].to(dev),
        position_ids=torch.cat(positions)[None].to(dev),
        segments=torch.cat(segments).to(dev),
        keep=torch.cat(keep).to(dev),
        rows=torch.cat(rows).to(dev),
        cols=torch.cat(cols).to(dev),
        targets=torch.cat(targets).to(dev),
    )


def _inner(model: nn.Module) -> Any:
    return getattr(model, "backbone", model)  # a ValueModel: its backbone


def _packed(model: nn.Module, mb: Batch, share: bool, device: torch.device) -> Packed | None:
    """``mb`` packed when sharing applies to it and ``model`` takes a 4-D mask, else None."""
    if not share:
        return None
    implementation = getattr(getattr(_inner(model), "config", None), "_attn_implementation", None)
    if implementation not in _MASKABLE:
        return None
    p = shared_prefix(mb)
    return pack(mb, p, device) if p else None


def _mask_dtype(model: nn.Module) -> torch.dtype:
    weight: Tensor = _inner(model).get_input_embeddings().weight
    return weight.dtype


def _keeps_logits(model: nn.Module) -> bool:
    """Whether the causal LM's forward takes ``logits_to_keep`` (transformers' models do)."""
    return "logits_to_keep" in inspect.signature(type(model).forward).parameters


def _scores(
    logits: Tensor, targets: Tensor, temperature: float, entropy: bool, entropy_grad: bool
) -> tuple[Tensor, Tensor | None]:
    if entropy:
        return logprobs_and_entropy(logits, targets, temperature, entropy_grad=entropy_grad)
    return gather_logprobs(logits, targets, temperature), None


def token_logprobs(
    model: nn.Module,
    mb: Batch,
    temperature: float,
    *,
    device: torch.device,
    share: bool,
    entropy: bool = False,
    entropy_grad: bool = True,
) -> TokenLogprobs:
    """The log-probs of ``mb``'s tokens under the causal LM ``model`` (and their entropies when
    ``entropy``; ``entropy_grad=False`` detaches them), ``[B, W - 1]``, packed around the
    shared prefix when ``share`` (module docstring). With or without gradient, as the caller
    runs it."""
    packed = _packed(model, mb, share, device)
    if packed is None:  # the padded batch
        ids = mb.sequence_ids.to(device)
        logits = model(input_ids=ids, attention_mask=mb.attention_mask.to(device)).logits
        lp, ent = _scores(logits[:, :-1], ids[:, 1:], temperature, entropy, entropy_grad)
        return TokenLogprobs(lp, ent, int(ids.numel()))
    kwargs: dict[str, Any] = {}
    if _keeps_logits(model):
        kwargs["logits_to_keep"] = packed.keep
    logits = model(
        input_ids=packed.input_ids,
        attention_mask=packed.attention_mask(_mask_dtype(model)),
        position_ids=packed.position_ids,
        **kwargs,
    ).logits  # [1, K, V] (or [1, N, V] without logits_to_keep)
    if "logits_to_keep" not in kwargs:
        logits = logits[:, packed.keep]
    lp, ent = _scores(logits, packed.targets[None], temperature, entropy, entropy_grad)
    width = mb.sequence_ids.shape[1] - 1
    return TokenLogprobs(
        logprobs=packed.unpack(lp[0], width),
        entropy=None if ent is None else packed.unpack(ent[0], width),
        tokens=packed.tokens,
    )


def position_logits(
    model: nn.Module,
    mb: Batch,
    rows: list[int],
    cols: list[int],
    *,
    device: torch.device,
    share: bool,
) -> Tensor:
    """The logits ``[P, V]`` of the causal LM ``model`` at ``P`` predicted positions of ``mb``
    (``cols[i]`` of row ``rows[i]``, each after the rows' shared prefix when packed: a policy
    token's position always is), in one forward packed around the shared prefix when ``share``
    (module docstring), else one forward per row. No gradient bookkeeping of its own: run it
    under ``torch.no_grad()`` for a measurement."""
    packed = _packed(model, mb, share, device)
    if packed is None:
        out = []
        for r in sorted(set(rows)):
            want = [c for rr, c in zip(rows, cols, strict=True) if rr == r]
            ids = mb.sequence_ids[r, : max(want) + 2].to(device)[None]
            keep = torch.tensor(want, dtype=torch.long, device=device)
            kwargs = {"logits_to_keep": keep} if _keeps_logits(model) else {}
            logits = model(input_ids=ids, **kwargs).logits[0]
            out.append(logits if "logits_to_keep" in kwargs else logits[keep])
        order = sorted(range(len(rows)), key=lambda i: (rows[i], i))  # the loop's order
        back = torch.empty(len(rows), dtype=torch.long)
        back[torch.tensor(order, dtype=torch.long)] = torch.arange(len(rows))
        return torch.cat(out)[back.to(device)]
    width = mb.sequence_ids.shape[1] - 1
    flat = (packed.rows * width + packed.cols).tolist()  # [K] each kept position's key
    where = {key: k for k, key in enumerate(flat)}
    try:
        index = [where[r * width + c] for r, c in zip(rows, cols, strict=True)]
    except KeyError as e:
        raise ValueError(f"a position before the shared prefix ({packed.prefix}): {e}") from None
    keep = packed.keep[torch.tensor(index, dtype=torch.long, device=packed.keep.device)]
    kwargs = {"logits_to_keep": keep} if _keeps_logits(model) else {}
    logits = model(
        input_ids=packed.input_ids,
        attention_mask=packed.attention_mask(_mask_dtype(model)),
        position_ids=packed.position_ids,
        **kwargs,
    ).logits[0]  # [P, V] (or [N, V] without logits_to_keep)
    return logits if "logits_to_keep" in kwargs else logits[keep]


def critic_values(critic: nn.Module, mb: Batch, *, device: torch.device, share: bool) -> Tensor:
    """A :class:`~areal_agents.trainers.modeling.ValueModel`'s values of ``mb`` at the predicted
    positions, ``[B, W - 1]`` (``V`` of the prefix up to and including token ``t``), packed
    around the shared prefix when ``share``. With or without gradient, as the caller runs it."""
    packed = _packed(critic, mb, share, device)
    if packed is None:
        ids = mb.sequence_ids.to(device)
        values: Tensor = critic(ids, mb.attention_mask.to(device))
        return values[:, :-1]
    values = critic(
        packed.input_ids,
        packed.attention_mask(_mask_dtype(critic)),
        position_ids=packed.position_ids,
    )  # [1, N]
    return packed.unpack(values[0, packed.keep], mb.sequence_ids.shape[1] - 1)


def micro_batch_cost(batch: Batch, share: bool) -> Callable[[list[int]], int] | None:
    """The tokens a micro-batch of ``batch``'s rows costs (for ``batching.plan``'s budget):
    packed when ``share``; None (the padded size, ``plan``'s default) otherwise."""
    if not share:
        return None
    return lambda rows: forwarded_tokens(batch.rows(rows), share=True)


# ---- before the first update: the no-grad passes on the whole batch ---------------------------


@dataclass(frozen=True)
class Prepass:
    """What the learner computes on the whole batch before any weight changes (``[B, T-1]``,
    None where the algorithm does not need it)."""

    proximal_logprobs: Tensor | None = None
    """The step-start policy's log-probs (a loss with ``proximal="step_start"``, >1 update)."""
    ref_logprobs: Tensor | None = None
    """The reference policy's log-probs (``algo.kl_coef > 0``)."""
    old_values: Tensor | None = None
    """The critic's values (an estimator that needs a critic)."""


@torch.no_grad()
def prepass(
    needs: Needs,
    batch: Batch,
    mbs: list[list[int]],
    *,
    policy: nn.Module,
    reference: nn.Module | None,
    critic: nn.Module | None,
    temperature: float,
    device: torch.device,
    share: bool,
    world_size: int,
) -> Prepass:
    """The tensors of :class:`Prepass` that ``needs`` asks for, on the whole batch: this rank's
    micro-batches ``mbs``, gathered from every rank (collective). ``reference=None`` with
    ``needs.reference``: the policy with its LoRA adapters off."""
    wanted = {
        "proximal_logprobs": needs.proximal_pass,
        "ref_logprobs": needs.reference,
        "old_values": needs.critic,
    }
    if not any(wanted.values()):
        return Prepass()
    local: dict[str, list[tuple[list[int], Tensor]]] = defaultdict(list)
    width = batch.sequence_ids.shape[1]

    def logprobs(model: nn.Module, mb: Batch) -> Tensor:
        out = token_logprobs(model, mb, temperature, device=device, share=share)
        return out.logprobs.float().cpu()

    for mb_rows in mbs:
        mb = batch.rows(mb_rows, width)
        if wanted["proximal_logprobs"]:
            local["proximal_logprobs"].append((mb_rows, logprobs(policy, mb)))
        if wanted["ref_logprobs"]:
            if reference is None:  # LoRA: the reference is the base, adapters off
                with adapters_disabled(policy):
                    local["ref_logprobs"].append((mb_rows, logprobs(policy, mb)))
            else:
                local["ref_logprobs"].append((mb_rows, logprobs(reference, mb)))
        if wanted["old_values"]:
            assert critic is not None
            v = critic_values(critic, mb, device=device, share=share)
            local["old_values"].append((mb_rows, v.float().cpu()))
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, dict(local))
    out: dict[str, Tensor] = {}
    for key, on in wanted.items():
        if not on:
            continue
        full = torch.zeros_like(batch.behavior_logprobs)
        for part in gathered:
            for rows, values in part.get(key, []):
                if rows:
                    full[rows] = values
        out[key] = full
    return Prepass(**out)
