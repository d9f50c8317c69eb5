"""The training command end to end on the calculator env with the tiny random model.

``model=tiny`` is a randomly initialised model of SmolLM2's architecture and tokenizer (see
``trainers/modeling.py``): it generates gibberish, so rewards stay near 0, but every part of
the real loop runs — the built-in server generates, the FSDP learner steps, weights are pushed
and the served version advances. The SIGKILL test really kills the whole process tree of a run
mid-way and checks that the re-run resumes it exactly: the same batches (task indices and
trajectory ids) as an uninterrupted run, none trained twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from areal_agents.errors import ConfigError
from areal_agents.files import read_jsonl as _read_jsonl
from areal_agents.train import main
from tests._train_run import TINY, run


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return _read_jsonl(path, torn_ok=True)


def _running(pid: int, created: float) -> bool:
    try:
        process = psutil.Process(pid)
        return process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _names(pids: list[int]) -> list[str]:
    names = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            names.append(f"{pid} {psutil.Process(pid).name()}")
    return names


def batches(run_dir: Path) -> list[tuple[list[int], list[str]]]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    return [(r["batch/task_indices"], r["batch/traj_ids"]) for r in rows]


@pytest.mark.integration
def test_time_budget_stops_cleanly_and_threads_reach_every_process(tmp_path: Path) -> None:
    budget = 20.0
    args = [
        *TINY,
        "trainer.total_steps=1000",
        f"trainer.time_budget_s={budget}",
        "trainer.checkpoint_every=0",  # only the final checkpoint: the early stop must save it
        # torch takes at most as many threads from OMP_NUM_THREADS as it sees cores: asking
        # for 1 against an inherited 2 shows that the setting reached each process (2+ cores)
        "trainer.torch_threads=1",
        "inference.torch_threads=1",
        f"output_dir={tmp_path}",
    ]
    proc = run(args, env={"OMP_NUM_THREADS": "2"})
    assert proc.wait(timeout=300) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "time_budget"
    assert summary["time_budget_s"] == budget
    assert summary["torch_threads"] == {"learner": 1, "servers": [1]}
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert 1 <= len(rows) == summary["steps"] < 1000
    longest = 0.0
    for row in rows:  # a step starts only if the time left covers the longest one so far
        took_batch_at = row["time/elapsed_s"] - row["time/step_s"] + row["time/wait_s"]
        assert took_batch_at <= budget - longest + 1.0
        longest = max(longest, row["time/step_s"])
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == [f"step_{len(rows):06d}"]
    trainer_state = json.loads((tmp_path / "checkpoints" / ckpts[0] / "trainer.json").read_text())
    assert trainer_state["step"] == len(rows)


@pytest.mark.integration
def test_a_test_sized_run_of_the_main_command(tmp_path: Path) -> None:
    """What a newcomer's run shows, at test size: held-out success before and after (in
    summary.json and on the closing screen), the stop on the time budget, the time to the first
    trained step, and a lean run directory (one checkpoint, one copy of the served weights)."""
    args = [
        *TINY,
        "trainer.total_steps=1000",
        "trainer.time_budget_s=40",  # a few steps, even on a busy machine
        "trainer.checkpoint_interval_s=1",  # a checkpoint after every step: one stays
        "eval.held_out_tasks=4",
        f"output_dir={tmp_path}",
    ]
    proc = run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    screen = out.decode()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "time_budget" and 1 <= summary["steps"] < 1000

    held = summary["held_out"]
    assert held["tasks"] == 4 and held["excluded_from_training"] is True
    for when in ("before", "after"):
        result = held[when]
        assert result["episodes"] == 4 and 0.0 <= result["success"] <= 1.0
        assert result["sampling"]["temperature"] == 0.0  # greedy, the same both times
        assert Path(result["viewer"]).is_file()
        eval_summary = json.loads((tmp_path / "eval" / when / "summary.json").read_text())
        assert eval_summary["pass@1"] == result["success"]
    assert held["before"]["sampling"] == held["after"]["sampling"]
    before, after = (f"{100 * held[w]['success']:.1f}%" for w in ("before", "after"))
    assert f"held-out success (4 tasks never trained on, greedy): {before} -> {after}" in screen
    # report.html shows the same figures, with an interval each, tool calls and turns
    from tests.trainers.test_report import embedded

    shown = embedded((tmp_path / "report.html").read_text())["held_out"]
    measured = ["before", "after"] + (["last"] if held["last"] else [])  # see below
    assert shown["tasks"] == 4 and [r["when"] for r in shown["rows"]] == measured
    for row in shown["rows"]:
        eval_summary = json.loads((tmp_path / "eval" / row["when"] / "summary.json").read_text())
        assert row["success"] == held[row["when"]]["success"] and row["episodes"] == 4
        assert row["ci"][0] <= row["success"] <= row["ci"][1], row
        assert row["turns_per_episode"] == eval_summary["turns_per_episode"] is not None
        assert row["tool_calls_per_episode"] == eval_summary["tool_calls_per_episode"] is not None
    assert f"run directory:     {tmp_path}" in screen and str(tmp_path / "summary.png") in screen
    assert "first trained step after" in screen

    first = summary["time_to_first_step_s"]
    assert 0 < first <= summary["times"]["total_s"]
    assert {"ray_s", "servers_s", "learners_s", "first_batch_s"} <= set(summary["startup"])

    steps = summary["steps"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [f"step_{steps:06d}"]
    # the final policy: the best of the candidates on 2 validation tasks (half the held-out
    # ones, after them), one copy kept
    chosen = held["selection"]
    assert chosen["tasks"] == 2 and chosen["last_step"] == steps
    every = sorted({*range(0, steps, 12), steps})  # RL's start, every 12 steps, the last
    assert list(chosen["candidates"]) == [str(s) for s in every]
    for step, success in chosen["candidates"].items():
        directory = tmp_path / "eval" / "validation" / f"step_{int(step):06d}"
        on = json.loads((directory / "summary.json").read_text())
        assert on["pass@1"] == success and on["episodes"] == 2
        # from eval.seed + eval.held_out_tasks on: no held-out task
        assert yaml.safe_load((directory / "config.yaml").read_text())["seed"] == 4
    best = max(chosen["candidates"].values())
    assert chosen["chosen_step"] == min(
        int(s) for s, v in chosen["candidates"].items() if v == best
    )
    final = Path(summary["final_weights"])
    assert final == (
        tmp_path / "weights" / f"v{steps:06d}"
        if chosen["chosen_step"] == steps
        else tmp_path / "candidates" / "step_000000"
    )
    assert (held["last"] is None) == (chosen["chosen_step"] == steps)
    kept = [*(tmp_path / "weights").iterdir(), *(tmp_path / "candidates").iterdir()]
    assert kept == [final]
    model_bytes = (final / "model.safetensors").stat().st_size
    checkpoint = sum(p.stat().st_size for p in (tmp_path / "checkpoints").rglob("*"))
    assert checkpoint <= 1.2 * model_bytes  # a finished run's checkpoint: no optimizer state
    run_bytes = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert run_bytes <= 3 * model_bytes  # the run directory: final weights and checkpoint
    assert summary["warm_start"] is None and held["base"] is None  # calculator: no warm start
    assert 0 < summary["time_to_first_step_without_eval_s"] < first


@pytest.mark.integration
@pytest.mark.slow
def test_sigkill_and_rerun_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    steps = 6
    common = [
        *TINY,
        f"trainer.total_steps={steps}",
        "trainer.max_staleness=1",
        "trainer.batch_order=admission",  # batches independent of episode timing
        "trainer.checkpoint_every=1",  # the kill lands after a checkpoint on the way
    ]
    reference, killed = tmp_path / "reference", tmp_path / "killed"

    proc = run([*common, f"output_dir={reference}"])
    assert proc.wait(timeout=600) == 0
    expected = batches(reference)
    assert len(expected) == steps
    rows = read_jsonl(reference / "metrics.jsonl")
    # what the servers served when a step's row was written: its own push, or with the push
    # overlapping the next step (trainer.overlap_weight_push) the one before, never older
    served = [r["server/weight_version"] for r in rows]
    assert all(step - 1 <= v <= step for step, v in enumerate(served, 1)), served
    assert served == sorted(served)
    assert max(r["staleness/max"] for r in rows) <= 1
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["final_version"] == steps

    proc = run([*common, f"output_dir={killed}"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while len(read_jsonl(killed / "metrics.jsonl")) < 3:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    tree = {p.pid: p.create_time() for p in psutil.Process(proc.pid).children(recursive=True)}
    names = {p.name() for p in psutil.Process(proc.pid).children(recursive=True)}
    assert {"raylet", "gcs_server", "ray::DashboardAgent"} <= names
    assert any(n.startswith("ray::Learner") for n in names)  # titled by the running method
    os.kill(proc.pid, signal.SIGKILL)  # the driver alone, as `kill -9 <pid>` does
    proc.wait(timeout=30)
    # Ray (agents included), its workers and the inference server die with the driver: 10 s
    # later nothing of the run is left
    deadline = time.monotonic() + 10
    while alive := [p for p, t in tree.items() if _running(p, t)]:
        assert time.monotonic() < deadline, f"still alive: {_names(alive)}"
        time.sleep(0.2)
    done_before = len(read_jsonl(killed / "metrics.jsonl"))
    assert done_before < steps

    proc = run([*common, f"output_dir={killed}"])
    assert proc.wait(timeout=600) == 0
    resumed = batches(killed)
    assert resumed == expected  # same task order, same trajectories, step by step
    trained = [i for _, ids in resumed for i in ids]
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    assert json.loads((killed / "summary.json").read_text())["final_version"] == steps


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_after_the_step_with_a_checkpoint_and_the_rerun_resumes(
    sig: signal.Signals, tmp_path: Path
) -> None:
    # no checkpoint by step or time on the way: the one on disk is the signal's
    common = [*TINY, "trainer.checkpoint_interval_s=null", f"output_dir={tmp_path}"]
    proc = run([*common, "trainer.total_steps=1000"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while len(read_jsonl(tmp_path / "metrics.jsonl")) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, sig)  # as Ctrl-C in a terminal: the whole process group
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig, err.decode()[-3000:]
    assert f"{sig.name}: stopping after this step" in err.decode()
    done = len(read_jsonl(tmp_path / "metrics.jsonl"))
    ckpts = [p.name for p in (tmp_path / "checkpoints").iterdir()]
    assert ckpts == [f"step_{done:06d}"]  # the step that was running is saved, nothing lost
    assert not (tmp_path / "summary.json").exists()  # not finished: a re-run continues it

    proc = run([*common, f"trainer.total_steps={done + 1}"], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    assert f"resuming step_{done:06d}" in out.decode()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, done + 2))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [f"step_{done + 1:06d}"]


@pytest.mark.integration
def test_a_run_killed_in_its_closing_evaluation_finishes_it_on_the_rerun(tmp_path: Path) -> None:
    """The last step's checkpoint is on disk but the held-out evaluation and summary.json are
    not (the process died in between): the same command trains nothing and evaluates."""
    common = [*TINY, "trainer.total_steps=1", "eval.held_out_tasks=2", f"output_dir={tmp_path}"]
    proc = run(common, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    first = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").unlink()  # as a kill during the evaluation leaves the run
    shutil.rmtree(tmp_path / "eval" / "after")

    proc = run(common, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert "already complete" not in out.decode() and "resuming step_000001" in out.decode()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]  # nothing retrained
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == first["steps"] == 1
    after = json.loads((tmp_path / "eval" / "after" / "summary.json").read_text())
    assert after["episodes"] == 2 and summary["held_out"]["after"]["episodes"] == 2


def _finished_run_dir(
    run_dir: Path, step: int, elapsed_s: float = 10.0, summary: bool = True
) -> None:
    """A run directory as training leaves it (config, a committed checkpoint and, once the
    closing evaluation is done, ``summary.json``)."""
    from areal_agents.config import dump_yaml, load_config
    from areal_agents.trainers.config import TrainConfig

    dump_yaml(load_config(TrainConfig, [*TINY, f"output_dir={run_dir}"]), run_dir / "config.yaml")
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer.json").write_text(json.dumps({"elapsed_s": elapsed_s}))
    if summary:
        (run_dir / "summary.json").write_text(json.dumps({"finished": True, "steps": step}))


@pytest.mark.parametrize(
    ("extra", "summary", "complete"),
    [
        (["trainer.total_steps=2"], True, True),
        (["trainer.total_steps=2"], False, False),  # killed in its closing evaluation
        (["trainer.total_steps=3"], True, False),  # more steps asked for: training continues
        (["trainer.total_steps=3", "trainer.time_budget_s=5"], True, True),  # budget spent
        (["trainer.total_steps=3", "trainer.time_budget_s=60"], True, False),
    ],
)
def test_a_finished_run_says_so_and_exits_without_starting_anything(
    extra: list[str],
    summary: bool,
    complete: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    from areal_agents.train import finished_run
    from areal_agents.trainers import loop

    _finished_run_dir(tmp_path, step=2, summary=summary)

    def no_training(cfg: object) -> None:
        raise AssertionError("training started")

    monkeypatch.setattr(loop, "train", no_training)
    args = [*TINY, f"output_dir={tmp_path}", *extra]
    if complete:
        main(args)
        out = capsys.readouterr().out
        assert f"run in {tmp_path} is already complete (step 2" in out and "nothing to do" in out
        assert not ray.is_initialized()
    else:
        from areal_agents.config import load_config
        from areal_agents.trainers.config import TrainConfig

        assert finished_run(load_config(TrainConfig, args)) is None
        with pytest.raises(AssertionError, match="training started"):
            main(args)


@pytest.mark.integration
@pytest.mark.slow
def test_a_test_sized_run_of_the_default_recipe_on_code(tmp_path: Path) -> None:
    """The default command's recipe on its own environment, at test size: the warm start runs
    on reference solutions, the held-out tasks are scored three times (base, after the warm
    start, after RL), and the time budget counts the warm start as training (the step count is
    raised so that the budget, the recipe's guard, is what stops this run)."""
    budget = 40.0
    args = [
        "model=tiny",
        "env.kwargs={sandbox_backend: process}",
        "env.group_size=2",
        "trainer.groups_per_step=2",
        "inference.max_tokens=16",
        "log.progress=false",
        "log.tensorboard=false",
        "ray.num_cpus=2",
        "warm_start.steps=3",
        "warm_start.batch_size=2",
        f"trainer.time_budget_s={budget}",
        "trainer.total_steps=100000",
        "eval.held_out_tasks=4",
        f"output_dir={tmp_path}",
    ]
    proc = run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err.decode()[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env"] == "code_sandbox" and summary["stop_reason"] == "time_budget"
    warm = summary["warm_start"]
    assert warm["steps"] == 3 and warm["demos"] == 6 and len(warm["losses"]) == 3
    held = summary["held_out"]
    for when in ("base", "before", "after"):
        assert held[when]["episodes"] == 4, when
    screen = out.decode()
    assert "warm start:" in screen and "RL:" in screen
    training = summary["training_s"]
    assert training["warm_start"] == warm["train_s"] > 0
    assert training["total"] == pytest.approx(training["warm_start"] + training["rl"], abs=0.2)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    last_step = float(rows[-1]["time/step_s"])
    # no step started after the budget's RL share: what the warm start left of it
    assert training["rl"] - last_step <= budget - training["warm_start"] + 1.0
    assert not (tmp_path / "warm_start").exists()  # a finished run drops the warm-start copy


@pytest.mark.integration
def test_eval_before_false_and_a_temperature_score_at_the_end_only_sampling(
    tmp_path: Path,
) -> None:
    args = [
        *TINY,
        "trainer.total_steps=1",
        "eval.held_out_tasks=2",
        "eval.before=false",
        "eval.temperature=1.0",
    ]
    proc = run([*args, f"output_dir={tmp_path}"], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0
    held = json.loads((tmp_path / "summary.json").read_text())["held_out"]
    assert held["before"] is None and held["base"] is None
    assert held["after"]["episodes"] == 2
    assert held["after"]["sampling"]["temperature"] == 1.0  # the default run's is 0.0
    assert "never trained on, temperature 1)" in out.decode()
    # no "before" or "base"; the final policy's choice (eval.validation_tasks: 1 task here)
    measured = ["after", *(["last"] if held["last"] else []), "validation"]
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == measured
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig

    with pytest.raises(ConfigError, match=r"eval\.temperature"):
        load_config(TrainConfig, [*TINY, "eval.temperature=-1"])
