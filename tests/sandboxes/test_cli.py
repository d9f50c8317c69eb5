"""python -m areal_agents.sandbox: build, run, doctor."""

from __future__ import annotations

import pytest

from areal_agents.sandbox import main


def test_run_prints_output_and_returns_the_exit_code(capsys: pytest.CaptureFixture[str]):
    rc = main(["run", "--backend", "process", "-c", "import sys; print(1+1); sys.exit(4)"])
    assert rc == 4 and capsys.readouterr().out == "2\n"


def test_run_a_file_and_report_a_timeout(tmp_path, capsys: pytest.CaptureFixture[str]):
    script = tmp_path / "loop.py"
    script.write_text("while True: pass\n")
    rc = main(["run", "--backend", "process", "--timeout", "0.5", str(script)])
    assert rc == 124 and "timed out" in capsys.readouterr().err


def test_doctor_reports_every_backend(capsys: pytest.CaptureFixture[str]):
    main(["doctor"])
    out = capsys.readouterr().out
    for name in ("docker", "bubblewrap", "process", "backend='auto' picks"):
        assert name in out


@pytest.mark.docker
def test_build_if_missing_keeps_the_existing_image(capsys: pytest.CaptureFixture[str]):
    assert main(["build", "--if-missing"]) == 0
    assert "already present" in capsys.readouterr().out


@pytest.mark.docker
def test_run_in_docker(capsys: pytest.CaptureFixture[str]):
    assert main(["run", "--backend", "docker", "-c", "import os; print(os.getuid())"]) == 0
    assert capsys.readouterr().out == "65534\n"
