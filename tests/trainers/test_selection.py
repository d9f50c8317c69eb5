"""The final policy chosen on validation tasks (``trainers/selection.py``): which steps are kept
as candidates, which one is chosen, what is loaded and scored, and what is kept on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from areal_agents.config import load_config
from areal_agents.errors import ConfigError
from areal_agents.trainers import selection
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.held_out import closing_screen
from areal_agents.trainers.selection import (
    candidate_dir,
    candidate_steps,
    choose_final,
    final_evaluations,
    final_weights,
    keep_candidate,
    selecting,
)


def config(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, ["env=calculator", *overrides])


class Learners:
    """Exports the step it was asked for as the weights' one tensor (what
    ``export_weights_to_driver`` writes on the driver's disk)."""

    def __init__(self) -> None:
        self.step = 0
        self.exports: list[str] = []

    def export_weights_to_driver(self, directory: Path) -> None:
        import torch
        from safetensors.torch import save_file

        directory.mkdir(parents=True)
        save_file({"step": torch.tensor([self.step])}, str(directory / "model.safetensors"))
        self.exports.append(directory.name)


class Server:
    """Serves whichever candidate it was last given; the versions it was given, in order."""

    base_url = "http://127.0.0.1:1/v1"

    def __init__(self) -> None:
        self.loaded: list[tuple[str, int]] = []
        self.sent: list[int] = []  # the versions that came as tensors, not from a path

    def update_weights_from_disk(self, path: str, version: int, timeout: float) -> None:
        self.loaded.append((Path(path).name, version))

    def update_weights_from_state_dict(self, state: dict, version: int, timeout: float) -> None:
        self.loaded.append((f"step_{int(state['step'][0]):06d}", version))
        self.sent.append(version)

    @property
    def serving(self) -> str:
        return self.loaded[-1][0]


def scored(monkeypatch: pytest.MonkeyPatch, server: Server, scores: dict[str, float]) -> list:
    """``evaluate`` replaced by a lookup of the served candidate's score per directory name
    (``step_NNNNNN`` on validation; ``after``/``last`` on the held-out tasks); the calls."""
    calls: list[tuple[str, str, int | None, int]] = []

    def evaluate(cfg: Any, url: str, name: str, directory: Path, *, tasks=None, first=0) -> dict:
        calls.append((directory.name, server.serving, tasks, first))
        return {"success": scores[server.serving], "episodes": tasks or 4}

    monkeypatch.setattr(selection, "evaluate", evaluate)
    return calls


def test_candidates_are_kept_at_the_start_every_validation_every_steps_and_at_the_last(
    tmp_path: Path,
) -> None:
    cfg = config("eval.held_out_tasks=8", "eval.validation_every=3")
    learners = Learners()
    kept = [s for s in range(8) if keep_candidate(cfg, learners, tmp_path, s)]
    assert kept == [0, 3, 6]
    assert keep_candidate(cfg, learners, tmp_path, 7, last=True)
    assert not keep_candidate(cfg, learners, tmp_path, 6, last=True)  # already kept: not again
    assert candidate_steps(tmp_path) == [0, 3, 6, 7]
    assert learners.exports == [f"step_{s:06d}.partial" for s in (0, 3, 6, 7)]
    assert not list((tmp_path / "candidates").glob("*.partial"))  # renamed once written

    every_2 = config("eval.held_out_tasks=8", "eval.validation_every=2")
    assert [s for s in range(1, 8) if keep_candidate(every_2, Learners(), tmp_path / "b", s)] == [
        2,
        4,
        6,
    ]
    off = config("eval.held_out_tasks=8", "eval.validation_tasks=0")
    assert not selecting(off) and not keep_candidate(off, Learners(), tmp_path / "c", 0)
    assert not (tmp_path / "c").exists()


def test_validation_tasks_default_to_half_the_held_out_tasks_and_can_be_set() -> None:
    assert config().eval.validation_count == 64
    assert config("eval.held_out_tasks=10").eval.validation_count == 5
    assert config("eval.held_out_tasks=10", "eval.validation_tasks=3").eval.validation_count == 3
    assert not selecting(config("eval.held_out_tasks=1"))  # 1 // 2 = 0: no selection
    assert selecting(config("eval.held_out_tasks=0", "eval.validation_tasks=4"))
    # a cluster selects too (candidates reach the server as tensors); where the client names
    # a LoRA adapter that vLLM serves on top of the base, no candidate can be swapped in
    assert selecting(config("ray.address=127.0.0.1:6379"))
    assert not selecting(config("model.lora.r=8", "inference.engine=vllm"))
    assert selecting(config("model.lora.r=8"))  # the built-in server loads the merged weights
    with pytest.raises(ConfigError, match=r"eval\.validation_every"):
        config("eval.validation_every=0")
    with pytest.raises(ConfigError, match="validation_tasks"):
        config("eval.validation_tasks=-1")


def make_candidates(run_dir: Path, steps: list[int]) -> None:
    for step in steps:
        candidate_dir(run_dir, step).mkdir(parents=True)


def test_the_best_candidate_on_validation_is_chosen_the_earliest_of_equal_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config("eval.held_out_tasks=8", "eval.validation_tasks=6")
    make_candidates(tmp_path, [0, 12, 24])
    server = Server()
    calls = scored(
        monkeypatch, server, {"step_000000": 0.5, "step_000012": 0.75, "step_000024": 0.75}
    )
    chosen, version = choose_final(cfg, server, "policy", tmp_path, last_step=24)
    assert chosen["chosen_step"] == 12  # 12 and 24 tie: the one moved least
    assert chosen["candidates"] == {"0": 0.5, "12": 0.75, "24": 0.75}
    # each candidate on the 6 validation tasks after the 8 held-out ones
    assert calls == [(f"step_{s:06d}", f"step_{s:06d}", 6, 8) for s in (0, 12, 24)]
    # new versions above the last step's, increasing (vLLM refuses others); the chosen reloaded
    assert server.loaded == [
        ("step_000000", 25),
        ("step_000012", 26),
        ("step_000024", 27),
        ("step_000012", 28),
    ]
    assert version == 28 and server.serving == "step_000012"
    assert candidate_steps(tmp_path) == [0, 12, 24]  # all kept until the final weights
    assert final_weights(tmp_path, chosen, 24) == candidate_dir(tmp_path, 12)
    assert candidate_steps(tmp_path) == [12]  # one copy of the final policy

    # a strictly better later step wins, and is not reloaded (it is served already)
    make_candidates(tmp_path / "b", [0, 5])
    server = Server()
    scored(monkeypatch, server, {"step_000000": 0.5, "step_000005": 0.625})
    chosen, version = choose_final(cfg, server, "policy", tmp_path / "b", last_step=5)
    assert chosen["chosen_step"] == 5 and version == 7 and len(server.loaded) == 2


def test_the_held_out_tasks_score_the_chosen_policy_and_the_last_step_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config("eval.held_out_tasks=8", "eval.validation_every=2")
    learners = Learners()
    for step in (0, 2):
        keep_candidate(cfg, learners, tmp_path, step)
    (tmp_path / "weights" / "v000003").mkdir(parents=True)  # the last step's served weights
    server = Server()
    scores = {"step_000000": 0.75, "step_000002": 0.25, "step_000003": 0.5}
    calls = scored(monkeypatch, server, scores)
    after, last, chosen = final_evaluations(cfg, learners, server, "policy", tmp_path, step=3)
    assert chosen is not None and chosen["chosen_step"] == 0 and chosen["last_step"] == 3
    assert after == {"success": 0.75, "episodes": 4}  # the held-out tasks on RL's start
    assert last == {"success": 0.5, "episodes": 4}  # and on the last step's weights
    assert [c[:2] for c in calls][-2:] == [("after", "step_000000"), ("last", "step_000003")]
    assert [c[2:] for c in calls][-2:] == [(None, 0), (None, 0)]  # all 8 held-out tasks
    assert final_weights(tmp_path, chosen, 3) == candidate_dir(tmp_path, 0)
    assert candidate_steps(tmp_path) == [0]  # one copy of the final policy
    assert not (tmp_path / "weights" / "v000003").exists()  # the last step: in its checkpoint
    assert chosen["weights"] == str(candidate_dir(tmp_path, 0))

    summary = {
        "held_out": {
            "tasks": 8,
            "before": {"success": 0.75},
            "after": after,
            "last": last,
            "selection": chosen,
        }
    }
    screen = closing_screen(summary)
    assert "final policy:    step 0 of 3, the best on 4 validation tasks" in screen
    assert "(step 0 75.0%, step 2 25.0%, step 3 50.0%)" in screen
    assert "RL's last step:  75.0% -> 50.0%" in screen


def test_where_the_last_step_is_chosen_its_served_weights_are_the_one_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config("eval.held_out_tasks=8")
    learners = Learners()
    keep_candidate(cfg, learners, tmp_path, 0)
    served = tmp_path / "weights" / "v000004"
    served.mkdir(parents=True)
    server = Server()
    calls = scored(monkeypatch, server, {"step_000000": 0.25, "step_000004": 0.5})
    after, last, chosen = final_evaluations(cfg, learners, server, "policy", tmp_path, step=4)
    assert chosen is not None and chosen["chosen_step"] == 4 and last is None
    assert [c[0] for c in calls] == ["step_000000", "step_000004", "after"]
    assert final_weights(tmp_path, chosen, 4) == served and candidate_steps(tmp_path) == []
    assert "RL's last step" not in closing_screen({"held_out": {"tasks": 8, "selection": chosen}})

    # without selection the held-out tasks score what is served, and nothing is kept apart
    off = config("eval.held_out_tasks=8", "eval.validation_tasks=0")
    server = Server()
    server.loaded.append(("v000004", 4))
    calls = scored(monkeypatch, server, {"v000004": 0.5})
    after, last, chosen = final_evaluations(off, Learners(), server, "policy", tmp_path / "o", 4)
    assert (after, last, chosen) == ({"success": 0.5, "episodes": 4}, None, None)
    assert final_weights(tmp_path / "o", None, 4) == tmp_path / "o" / "weights" / "v000004"


def test_on_a_cluster_candidates_come_to_the_driver_and_reach_the_server_as_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the server's node need not share the driver's disk: each candidate is sent as tensors
    cfg = config("eval.held_out_tasks=8", "eval.validation_every=2", "ray.address=127.0.0.1:1")
    learners = Learners()
    for step in (0, 2):
        learners.step = step
        keep_candidate(cfg, learners, tmp_path, step)
    learners.step = 3
    server = Server()
    scored(monkeypatch, server, {"step_000000": 0.25, "step_000002": 0.5, "step_000003": 0.75})
    after, last, chosen = final_evaluations(cfg, learners, server, "policy", tmp_path, step=3)
    assert chosen is not None and chosen["chosen_step"] == 3 and last is None
    assert after == {"success": 0.75, "episodes": 4}  # the held-out tasks on the chosen step
    # what the server served came from each candidate's own weights, never from a path
    assert server.loaded == [("step_000000", 4), ("step_000002", 5), ("step_000003", 6)]
    assert server.sent == [4, 5, 6]
    # no weight sync wrote the last step under <run>/weights here: its candidate is the copy kept
    assert final_weights(tmp_path, chosen, 3) == candidate_dir(tmp_path, 3)
    assert candidate_steps(tmp_path) == [3]

    locally = Server()  # the same candidates on a local run are loaded from the driver's disk
    scored(monkeypatch, locally, {"step_000003": 0.75})
    choose_final(config("eval.held_out_tasks=8"), locally, "policy", tmp_path, last_step=3)
    assert locally.loaded == [("step_000003", 4)] and locally.sent == []
