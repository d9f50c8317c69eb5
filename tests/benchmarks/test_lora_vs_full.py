"""benchmarks/lora_vs_full.py and learner_lora.py: the figures derived from a run, and the
commands each setting runs (the runs themselves take minutes: see benchmarks/README.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import learner_lora
import lora_vs_full


def _fake_run(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    rows = [
        {"step": 1, "episodes": 16, "reward/mean": 0.25, "time/elapsed_s": 100.0,
         "time/train_s": 40.0, "time/sync_s": 2.0},
        {"step": 2, "episodes": 16, "reward/mean": 0.5, "time/elapsed_s": 210.0,
         "time/train_s": 50.0, "time/sync_s": 1.0},
        {"step": 3, "episodes": 16, "reward/mean": 0.75, "time/elapsed_s": 300.0,
         "time/train_s": 45.0, "time/sync_s": 3.0},
    ]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "stop_reason": "time_budget",
        "held_out": {"tasks": 32, "before": {"success": 0.25}, "after": {"success": 0.625}},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_summarise_reads_steps_curve_and_held_out_gain(tmp_path: Path) -> None:
    _fake_run(tmp_path / "lora_r16")
    result = lora_vs_full.summarise(tmp_path / "lora_r16")
    assert result["steps"] == 3 and result["episodes"] == 48
    assert result["train_elapsed_s"] == 300.0
    assert result["curve"] == [[100.0, 0.25], [210.0, 0.5], [300.0, 0.75]]
    assert (result["median_train_s"], result["median_sync_s"]) == (45.0, 2.0)
    assert (result["held_out_before"], result["held_out_after"]) == (0.25, 0.625)
    assert result["gain_points"] == 37.5 and result["stop_reason"] == "time_budget"


def test_the_settings_differ_only_in_lora_and_its_learning_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both settings run the same quickstart command with the same budget, held-out tasks and
    seed; LoRA adds its rank, alpha and learning rate."""
    commands: list[list[str]] = []

    class Done:
        returncode = 0

    real = lora_vs_full.subprocess.run

    def run(command: list[str], **kwargs: object) -> object:
        if "areal_agents.train" not in command:  # git, ps: machine_info
            return real(command, **kwargs)  # type: ignore[call-overload]
        commands.append(command)
        _fake_run(Path(next(a for a in command if a.startswith("output_dir="))[11:]))
        return Done()

    monkeypatch.setattr(lora_vs_full.subprocess, "run", run)
    out = lora_vs_full.main(
        ["--root", str(tmp_path), "--budget-s", "60", "--json", str(tmp_path / "r.json")]
    )
    full, lora = commands
    assert lora[: len(full)] == [a.replace("/full", "/lora_r16") for a in full]
    assert lora[len(full) :] == ["model.lora.r=16", "model.lora.alpha=32", "trainer.lr=2e-4"]
    assert "trainer.time_budget_s=60.0" in full and "eval.held_out_tasks=64" in full
    assert set(out["runs"]) == {"full", "lora_r16"}
    assert json.loads((tmp_path / "r.json").read_text())["runs"]["full"]["gain_points"] == 37.5


def test_learner_lora_accepts_the_full_push_path() -> None:
    with pytest.raises(SystemExit):
        learner_lora.main(["--full-push", "http"])
