"""The training command refuses what would fail before anything starts: bad keys and values,
a run directory that belongs to another run, and ``--check``, which validates and starts nothing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from areal_agents.errors import ConfigError
from areal_agents.train import main
from tests._train_run import TINY, run


def test_bad_keys_fail_at_start_with_the_key_and_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["trainer.max_stalenes=3"])
    assert e.value.code == 2
    assert "did you mean 'max_staleness'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["trainer.mode=sync", "trainer.max_staleness=2"])
    assert "sync mode trains with staleness 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["algo=grpo", "env.group_size=1"])
    assert "env.group_size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["env=nosuchns/Nope-v0"], r"env='nosuchns/Nope-v0': Namespace nosuchns not found"),
        (["env=nosuchmodule:Env-v0"], r"env='nosuchmodule:Env-v0': cannot import module"),
        (
            ["env=calculator", "env.kwargs={bogus: 1}"],
            r"env\.kwargs: CalculatorEnv got an unknown option 'bogus'",
        ),
        (["output_dir=/proc/nope"], r"output_dir=/proc/nope: cannot write there"),
        (["trainer.rollout_workers=0"], r"trainer\.rollout_workers=0: must be at least 1"),
        (["trainer.learner_ranks=0"], r"trainer\.learner_ranks=0: must be at least 1"),
        (["inference.temperature=nan"], r"inference\.temperature=nan: must be a finite"),
        (["inference.request_timeout_s=-1"], r"inference\.request_timeout_s=-1\.0: a duration"),
    ],
)
def test_bad_values_are_refused_before_ray_or_a_server_starts(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    with pytest.raises(SystemExit) as e:
        main([*TINY, *extra])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert re.match(rf"error: .*{message}", out.err) and "Traceback" not in out.err
    assert "run directory" not in out.out  # the loop never began: no Ray, no server
    assert not ray.is_initialized()


def test_the_train_command_refuses_zero_rollout_workers_without_starting_ray() -> None:
    proc = run(["trainer.rollout_workers=0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert err.decode().startswith("error: trainer.rollout_workers=0: must be at least 1")
    assert b"Traceback" not in err and b"run directory" not in out


def test_resume_refuses_a_different_run(tmp_path: Path) -> None:
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig
    from areal_agents.trainers.runtime import choose_run_dir, save_config

    out = f"output_dir={tmp_path}"
    cfg = load_config(TrainConfig, [*TINY, out])
    save_config(cfg, tmp_path)
    (tmp_path / "checkpoints" / "step_000001").mkdir(parents=True)
    assert choose_run_dir(cfg)[1] == tmp_path / "checkpoints" / "step_000001"
    other = load_config(TrainConfig, [*TINY, out, "env.group_size=3"])
    with pytest.raises(ConfigError, match=r"env\.group_size"):
        choose_run_dir(other)
    with pytest.raises(ConfigError, match=r"trainer\.resume=never"):
        choose_run_dir(load_config(TrainConfig, [*TINY, out, "trainer.resume=never"]))


def test_help_names_config_files_and_check(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--help"])
    out = capsys.readouterr().out
    assert "config=FILE.yaml" in out and "--check" in out and "trainer.total_steps=" in out


def test_check_validates_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    main([*TINY, f"output_dir={tmp_path / 'run'}", "--check"])
    out = capsys.readouterr().out
    assert "configuration OK (nothing started)" in out and "group_size: 2" in out
    assert not ray.is_initialized() and not (tmp_path / "run").exists()  # nothing created
