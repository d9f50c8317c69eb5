"""How far each step moves the policy: the exact KL between the policy before and after an update,
on a fixed probe set of token positions, and the learning-rate brake that holds it near a target.

A training step with a real reward and a placebo step with shuffled rewards can be equally large:
Adam moves every weight by about the learning rate whatever the gradient says. What differs is
where the policy goes. :class:`PolicyProbe` measures how far it goes, the same way every step:
it fixes a set of the policy's own token positions once (the first batch's, up to
``trainer.probe_tokens``, a row of every group before a second of any; kept in the
checkpoint), keeps the policy's full next-token distribution at each (``log_softmax`` over the
vocabulary, at the sampling temperature), and after every step computes

    policy/update_kl = mean over positions of  sum_v p_before(v) log(p_before(v) / p_after(v))

exactly (no sampling estimate), then keeps the new distributions for the next step. One no-grad
forward pass over the probe rows per step (two at the first step and after a resume), packed
around the prompt prefix the rows share (``trainer.share_prompt_prefix``,
:func:`~areal_agents.trainers.forward.position_logits`): the rows' system prompt and tool
schemas run once, not once per row (unpacked, the probe cost about a quarter of the learner's
time on the default recipe).

:class:`KLBrake` (``trainer.target_kl``) is the trust region that acts on that measurement:
after a step that moved the policy more than the target, the learning rate of the next steps is
scaled down, and back up (never above the configured one) after steps that moved it less. A
step's KL grows with the square of its size, so the scale moves by ``sqrt(target / kl)``,
limited to a factor of 2 per step.

>>> brake = KLBrake(target=0.01)
>>> round(brake.update(0.04), 3), round(brake.update(0.0025), 3), round(brake.update(None), 3)
(0.5, 1.0, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from areal_agents.trainers.batching import Batch
from areal_agents.trainers.forward import position_logits
from areal_agents.trainers.fsdp import reshard

__all__ = ["KLBrake", "PolicyProbe"]


def _round_robin(group_ids: list[str]) -> list[int]:
    """Row indices, the k-th row of every group (in order of first appearance) before any
    group's (k+1)-th.

    >>> _round_robin(["a", "a", "b", "b", "c"])
    [0, 2, 4, 1, 3]
    """
    members: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    rank = {i: k for rows in members.values() for k, i in enumerate(rows)}
    return sorted(range(len(group_ids)), key=lambda i: rank[i])


@dataclass
class KLBrake:
    """The learning-rate scale that keeps the probe's per-step KL near ``target`` (None: off,
    scale 1). ``min_scale`` bounds how far it brakes."""

    target: float | None
    scale: float = 1.0
    min_scale: float = 1e-3

    def update(self, kl: float | None) -> float:
        """The scale for the next step, after a step that moved the policy ``kl`` nats/token."""
        if self.target is None or kl is None or not math.isfinite(kl):
            return self.scale
        factor = math.sqrt(self.target / max(kl, 1e-12))
        factor = min(2.0, max(0.5, factor))
        self.scale = min(1.0, max(self.min_scale, self.scale * factor))
        return self.scale

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state.get("scale", 1.0))


@dataclass
class PolicyProbe:
    """A fixed set of up to ``tokens`` policy-token positions and the policy's distribution at
    each, before the next update (module docstring). ``tokens=0`` turns it off."""

    tokens: int
    temperature: float = 1.0
    share: bool = True
    """Run the probe rows' shared prompt prefix once (``trainer.share_prompt_prefix``)."""
    rows: list[tuple[list[int], list[int]]] | None = None
    """The probe: ``(token ids, predicted positions)`` per row, fixed at the first batch."""
    _last: list[Tensor] | None = field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        return self.tokens > 0

    def fix(self, batch: Batch) -> None:
        """Take the probe from ``batch`` (the first one) if it has none yet: each row's policy
        positions, until ``tokens`` positions are held, taking the rows a group at a time (the
        first row of every group, then the second of every group, ...), so that the probe
        spans as many of the batch's prompts as it can hold rows."""
        if not self.enabled or self.rows is not None:
            return
        rows: list[tuple[list[int], list[int]]] = []
        left = self.tokens
        for i in _round_robin(batch.group_ids):
            if left <= 0:
                break
            positions = torch.nonzero(batch.loss_mask[i] > 0).flatten().tolist()[:left]
            if not positions:
                continue
            ids = batch.sequence_ids[i, : positions[-1] + 2].tolist()  # through the last target
            rows.append((ids, positions))
            left -= len(positions)
        self.rows = rows

    def _batch(self) -> Batch:
        """The probe rows as a padded batch whose loss mask marks the probe positions."""
        rows = self.rows or []
        width = max(len(ids) for ids, _ in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width - 1)
        for i, (row, positions) in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention[i, : len(row)] = 1
            mask[i, positions] = 1.0
        return Batch(
            sequence_ids=ids,
            attention_mask=attention,
            loss_mask=mask,
            behavior_logprobs=torch.zeros_like(mask),
            rewards=torch.zeros(len(rows)),
            truncated=torch.zeros(len(rows), dtype=torch.bool),
            group_ids=[str(i) for i in range(len(rows))],
            lengths=[len(row) for row, _ in rows],
        )

    @torch.no_grad()
    def _distributions(self, model: nn.Module, device: torch.device) -> list[Tensor]:
        rows = self.rows or []
        if not rows:
            return []
        index = [i for i, (_, positions) in enumerate(rows) for _ in positions]
        cols = [t for _, positions in rows for t in positions]
        logits = position_logits(
            model, self._batch(), index, cols, device=device, share=self.share
        )  # [P, V]
        reshard(model)  # no backward follows: leave the root sharded, as training expects
        scores = torch.log_softmax(logits.float() / self.temperature, dim=-1).cpu()
        return list(scores.split([len(positions) for _, positions in rows]))

    def before(self, model: nn.Module, device: torch.device) -> None:
        """Hold the current policy's distributions unless already held (the first step, or the
        first after a resume). Collective under FSDP: every rank calls it."""
        if self.enabled and self.rows and self._last is None:
            self._last = self._distributions(model, device)

    def after(self, model: nn.Module, device: torch.device) -> float | None:
        """The exact KL(before || now) per probe position, averaged; the current distributions
        become the next step's "before". None when off. Collective under FSDP."""
        if not self.enabled or not self.rows or self._last is None:
            return None
        now = self._distributions(model, device)
        total, count = 0.0, 0
        for old, new in zip(self._last, now, strict=True):
            kl = (old.exp() * (old - new)).sum(dim=-1)  # [k]
            total += float(kl.sum())
            count += int(kl.numel())
        self._last = now
        return total / max(count, 1)

    def state_dict(self) -> dict[str, Any]:
        """The probe's positions (its distributions are recomputed after a resume)."""
        return {"rows": self.rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = state.get("rows")
        self._last = None
