"""From trajectories to padded tensors and their log-probabilities, split over learner ranks and
token-budget micro-batches.

Positions: ``sequence_ids`` is ``[B, T]``; everything the loss sees is aligned to the *predicted*
tokens, ``[B, T - 1]`` (logits at ``t`` predict token ``t + 1``): the batch's ``loss_mask`` and
``behavior_logprobs`` (:func:`collate`), and the current policy's log-probs
(:func:`sequence_logprobs`), which line up with them token for token.

Log-probabilities and entropies come from TRL's memory-efficient kernels
(``trl.trainer.utils``: ``selective_log_softmax``, ``entropy_from_logits``,
``selective_log_softmax_and_entropy``), which gather row by row instead of materialising a full
``log_softmax`` over the vocabulary. TRL is imported on first use (it takes a few seconds).

Every learner rank receives the whole batch and computes the same split, so that all ranks run
the same number of micro-batches (FSDP's collectives need that): a rank with less work gets
empty micro-batches (one padding row with an all-zero mask) that contribute exactly nothing.

>>> from areal_agents.types import Trajectory
>>> t = Trajectory((1, 2, 3), (0, 1, 1), (0.0, -0.5, -0.7), (-1, 0, 0), 1.0, "g")
>>> b = collate([t], pad_id=0)
>>> b.sequence_ids.tolist(), b.loss_mask.tolist(), b.behavior_logprobs.tolist()
([[1, 2, 3]], [[1.0, 1.0]], [[-0.5, -0.699999988079071]])
>>> split_ranks([5, 3, 3, 1], world_size=2)
[[0, 3], [1, 2]]
>>> micro_batches([0, 1, 2], [10, 10, 30], budget=32)
[[0, 1], [2]]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor

from areal_agents.errors import DependencyError
from areal_agents.types import Trajectory

__all__ = [
    "Batch",
    "collate",
    "entropy_from_logits",
    "gather_logprobs",
    "logprobs_and_entropy",
    "micro_batches",
    "plan",
    "sequence_logprobs",
    "split_minibatches",
    "split_ranks",
    "token_staleness",
]


@dataclass
class Batch:
    """A padded batch; ``loss_mask`` and ``behavior_logprobs`` are ``[B, T-1]`` (aligned to the
    predicted tokens)."""

    sequence_ids: Tensor  # [B, T] long
    attention_mask: Tensor  # [B, T] long
    loss_mask: Tensor  # [B, T-1] float, 1 on predicted policy tokens
    behavior_logprobs: Tensor  # [B, T-1]
    rewards: Tensor  # [B]
    truncated: Tensor  # [B] bool: the episode hit max_turns
    group_ids: list[str]
    lengths: list[int]
    versions: Tensor | None = None  # [B, T-1] long: each predicted token's weight version (-1 off)

    def rows(self, index: Sequence[int], width: int | None = None) -> Batch:
        """A sub-batch of rows ``index``, cropped to ``width`` input positions (default: the
        longest of those rows). An empty ``index`` gives one all-padding row with mask 0."""
        if not index:
            pad = torch.zeros(1, 2, dtype=torch.long)
            zero = torch.zeros(1, 1)
            return Batch(
                pad,
                torch.ones_like(pad),
                zero,
                zero.clone(),
                torch.zeros(1),
                torch.zeros(1, dtype=torch.bool),
                [""],
                [2],
            )
        idx = torch.tensor(list(index), dtype=torch.long)
        w = width or max(self.lengths[i] for i in index)
        w = max(w, 2)
        return Batch(
            sequence_ids=self.sequence_ids[idx, :w],
            attention_mask=self.attention_mask[idx, :w],
            loss_mask=self.loss_mask[idx, : w - 1],
            behavior_logprobs=self.behavior_logprobs[idx, : w - 1],
            rewards=self.rewards[idx],
            truncated=self.truncated[idx],
            group_ids=[self.group_ids[i] for i in index],
            lengths=[self.lengths[i] for i in index],
            versions=None if self.versions is None else self.versions[idx, : w - 1],
        )


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> Batch:
    """Right-pad trajectories into one :class:`Batch`."""
    if not trajectories:
        raise ValueError("cannot collate an empty batch")
    lengths = [max(len(t.sequence_ids), 2) for t in trajectories]
    B, T = len(trajectories), max(lengths)
    sequence_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    behavior_logprobs = torch.zeros(B, T)
    versions = torch.full((B, T), -1, dtype=torch.long)
    for i, t in enumerate(trajectories):
        n = len(t.sequence_ids)
        sequence_ids[i, :n] = torch.tensor(t.sequence_ids, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        behavior_logprobs[i, :n] = torch.tensor(t.behavior_logprobs, dtype=torch.float32)
        versions[i, :n] = torch.tensor(t.versions, dtype=torch.long)
    return Batch(
        sequence_ids=sequence_ids,
        attention_mask=attn,
        loss_mask=mask[:, 1:].contiguous(),
        behavior_logprobs=behavior_logprobs[:, 1:].contiguous(),
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        truncated=torch.tensor([t.truncated for t in trajectories], dtype=torch.bool),
        group_ids=[t.group_id for t in trajectories],
        lengths=lengths,
        versions=versions[:, 1:].contiguous(),
    )


def split_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Rows per rank, balancing tokens greedily (longest first; ties to the lower rank)."""
    load = [0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        out[r].append(i)
        load[r] += lengths[i]
    return [sorted(rows) for rows in out]


def micro_batches(
    rows: Sequence[int],
    lengths: Sequence[int],
    budget: int,
    cost: Callable[[list[int]], int] | None = None,
) -> list[list[int]]:
    """Consecutive groups of ``rows`` whose size stays within ``budget`` tokens (a single
    longer row gets a micro-batch of its own). The size of a group is ``cost(group)`` (the
    tokens its forward runs on, e.g. ``trainers/forward.py``'s packing), by default the padded
    size: rows x longest."""

    def size(group: list[int]) -> int:
        return len(group) * max(lengths[j] for j in group) if cost is None else cost(group)

    out: list[list[int]] = []
    current: list[int] = []
    for i in rows:
        if current and size([*current, i]) > budget:
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    return out


def split_minibatches(group_ids: Sequence[str], n: int) -> list[list[int]]:
    """Rows split into ``n`` minibatches of whole groups (in order)."""
    groups: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, g in enumerate(group_ids):
        if g not in seen:
            seen[g] = len(groups)
            groups.append([])
        groups[seen[g]].append(i)
    n = min(n, len(groups))
    out: list[list[int]] = [[] for _ in range(n)]
    for k, rows in enumerate(groups):
        out[k * n // len(groups)].extend(rows)
    return out


def plan(
    rows: Sequence[int],
    lengths: Sequence[int],
    world_size: int,
    rank: int,
    budget: int,
    cost: Callable[[list[int]], int] | None = None,
) -> list[list[int]]:
    """This rank's micro-batches for ``rows``, padded with empty ones to the ranks' maximum
    (``cost``: :func:`micro_batches`)."""
    per_rank = split_ranks([lengths[i] for i in rows], world_size)
    mine = [[rows[j] for j in part] for part in per_rank]
    mbs = [micro_batches(part, lengths, budget, cost) for part in mine]
    count = max(1, *(len(m) for m in mbs))
    return mbs[rank] + [[] for _ in range(count - len(mbs[rank]))]


# ---- log-probabilities of the tokens ----------------------------------------------------------


@functools.cache
def _trl_utils() -> ModuleType:
    try:
        import trl.trainer.utils as utils
    except ImportError as e:  # pragma: no cover - trl is part of the train extra
        raise DependencyError.missing("trl", "train") from e
    return utils


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (the sampling temperature)")


def gather_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` at ``tokens``: ``[..., V]`` x ``[...]`` -> ``[...]``.

    Divide by the temperature the tokens were *sampled* with, so that the learner's log-probs
    match the inference server's.
    """
    _check_temperature(temperature)
    return _trl_utils().selective_log_softmax(logits, tokens, temperature=temperature)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, chunk_size: int = 128) -> Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)``: ``[..., V]`` -> ``[...]``."""
    _check_temperature(temperature)
    if temperature != 1.0:
        logits = logits / temperature
    return _trl_utils().entropy_from_logits(logits, chunk_size=chunk_size)


def logprobs_and_entropy(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0, entropy_grad: bool = True
) -> tuple[Tensor, Tensor]:
    """Both of the above in one pass over the logits; ``entropy_grad=False`` detaches it."""
    _check_temperature(temperature)
    return _trl_utils().selective_log_softmax_and_entropy(
        logits, tokens, entropy_requires_grad=entropy_grad, temperature=temperature
    )


def sequence_logprobs(logits: Tensor, sequence_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Causal-LM logits ``[B, T, V]`` and ids ``[B, T]`` -> ``[B, T - 1]``: position ``t`` holds
    ``log p(sequence_ids[:, t + 1] | sequence_ids[:, :t + 1])``, aligned with the batch's
    ``loss_mask`` and ``behavior_logprobs``."""
    if logits.dim() != 3 or sequence_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"logits {tuple(logits.shape)} and sequence_ids {tuple(sequence_ids.shape)}: "
            "expected [B, T, V] and [B, T]"
        )
    return gather_logprobs(logits[:, :-1], sequence_ids[:, 1:], temperature)


def token_staleness(versions: Tensor, mask: Tensor, version: int) -> dict[str, float]:
    """How many weight versions old the batch's policy tokens are, trained at ``version``:
    ``staleness/token_mean`` and ``staleness/token_max`` over every policy token, and
    ``staleness/turn<k>_mean`` for the k-th assistant turn of the episodes (0 first).

    >>> v = torch.tensor([[-1, 3, 3, -1, 4], [-1, 3, -1, -1, -1]])
    >>> m = (v >= 0).float()
    >>> token_staleness(v, m, version=5)
    {'staleness/token_mean': 1.75, 'staleness/token_max': 2.0, 'staleness/turn0_mean': 2.0, \
'staleness/turn1_mean': 1.0}
    """
    on = mask > 0
    if not bool(on.any()):
        return {}
    age = (version - versions).to(torch.float64)  # [B, T]
    out = {
        "staleness/token_mean": float(age[on].mean()),
        "staleness/token_max": float(age[on].max()),
    }
    start = on & ~torch.nn.functional.pad(on, (1, 0))[:, :-1]  # a turn's first token
    turn = start.long().cumsum(dim=1) - 1  # [B, T]
    for k in range(int(turn[on].max()) + 1):
        here = on & (turn == k)
        out[f"staleness/turn{k}_mean"] = float(age[here].mean())
    return out
