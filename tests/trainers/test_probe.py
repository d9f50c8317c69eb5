"""The probe's ``policy/update_kl`` is the exact KL between the policy before and after a step,
on the probe positions; it survives a checkpoint; the brake follows its formula."""

from __future__ import annotations

import pytest
import torch

from areal_agents.trainers.probe import KLBrake
from tests.trainers._tiny_learner import (
    batch,
    learner,
    process_group,  # noqa: F401  (the autouse fixture)
)


def _distributions(lrn: object, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    model = lrn.model  # type: ignore[attr-defined]
    out = []
    with torch.no_grad():
        for ids, positions in rows:
            logits = model(input_ids=torch.tensor([ids])).logits[0]  # every position
            out.append(torch.log_softmax(logits[positions].double(), dim=-1))
    return out


def test_update_kl_is_the_exact_kl_on_the_probe_positions(tmp_path: object) -> None:
    lrn = learner(probe_tokens=12)
    data = batch()
    lrn.probe.fix(lrn_batch(lrn, data))
    rows = lrn.probe.rows
    assert rows is not None and sum(len(p) for _, p in rows) == 12  # 8 of row 0, 4 of row 2
    assert [len(p) for _, p in rows] == [8, 4]
    # a row of each group before a second of either: rows 0 (group a) and 2 (group b)
    assert [ids for ids, _ in rows] == [list(data[0].sequence_ids), list(data[2].sequence_ids[:8])]
    old = _distributions(lrn, rows)
    metrics = lrn.train_step(data)
    new = _distributions(lrn, rows)
    exact = torch.cat([(o.exp() * (o - n)).sum(-1) for o, n in zip(old, new, strict=True)])
    # float32 sums in another order: up to 1.4e-4 apart (the second step, on one CPU). The
    # direction of the KL is not told apart at any such tolerance (the reverse KL is within
    # 2.2e-5 of this one); the positions and the mean are what this checks
    assert metrics["policy/update_kl"] == pytest.approx(float(exact.mean()), rel=1e-3)
    # the next step measures from where this one ended
    second = lrn.train_step(batch(offset=-0.3))
    newer = _distributions(lrn, rows)
    exact2 = torch.cat([(o.exp() * (o - n)).sum(-1) for o, n in zip(new, newer, strict=True)])
    assert second["policy/update_kl"] == pytest.approx(float(exact2.mean()), rel=1e-3)
    # a checkpoint keeps the probe's positions (and the brake's scale)
    lrn.save_checkpoint(str(tmp_path))
    again = learner(probe_tokens=12)
    again.load_checkpoint(str(tmp_path))
    assert again.probe.rows == rows
    third = again.train_step(batch(offset=0.2))
    assert third["policy/update_kl"] > 0


@pytest.mark.parametrize("share", [True, False])
def test_rows_sharing_a_prompt_are_probed_in_one_packed_forward(share: bool) -> None:
    """With a shared prompt prefix the probe runs it once (trainer.share_prompt_prefix) and
    still measures the exact KL: the packed distributions are the unpacked ones."""
    prefix = tuple(range(100, 130))  # 30 tokens every row starts with (a system prompt)
    lrn = learner(probe_tokens=12, share_prompt_prefix=share)
    data = batch(prefix=prefix)
    lrn.probe.fix(lrn_batch(lrn, data))
    rows = lrn.probe.rows
    assert rows is not None and len(rows) == 2
    calls: list[int] = []
    hook = lrn.model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape[1]),
        with_kwargs=True,
    )
    try:
        old = _distributions(lrn, rows)
        got = lrn.probe._distributions(lrn.model, lrn.device)
    finally:
        hook.remove()
    probe_calls = calls[len(rows) :]  # _distributions above forwards each row once
    if share:  # one forward: the prefix once, then each row's rest but its last token
        assert probe_calls == [sum(len(ids) - 1 for ids, _ in rows) - len(prefix)]
    else:
        assert probe_calls == [len(ids) for ids, _ in rows]
    for mine, exact in zip(got, old, strict=True):
        torch.testing.assert_close(mine.double(), exact, atol=1e-4, rtol=1e-4)
    metrics = lrn.train_step(data)
    assert metrics["policy/update_kl"] > 0


def lrn_batch(lrn: object, data: list[object]) -> object:
    from areal_agents.trainers.batching import collate

    return collate(data, lrn.pad_id)  # type: ignore[arg-type, attr-defined]


def test_kl_brake_formula() -> None:
    brake = KLBrake(target=0.01)
    assert brake.update(0.01) == 1.0  # on target: the configured lr
    assert brake.update(0.0025) == 1.0  # never above it
    assert brake.update(0.015625) == pytest.approx(0.8)  # sqrt(0.01 / 0.015625)
    assert brake.update(10.0) == pytest.approx(0.4)  # at most halved per step
    assert brake.update(0.0001) == pytest.approx(0.8)  # at most doubled
    brake.load_state_dict({"scale": 0.5})
    assert brake.scale == 0.5 and KLBrake(target=None).update(5.0) == 1.0
