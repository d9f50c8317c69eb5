"""python -m areal_agents.sandbox: build, run, doctor."""

from __future__ import annotations

import contextlib
import uuid

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


def test_run_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 10.0)" in out and "(default: auto)" in out


@pytest.mark.docker
def test_a_rebuild_removes_the_image_it_replaced_unless_a_container_uses_it():
    import docker

    client = docker.from_env()
    name = f"areal-rebuild-test:{uuid.uuid4().hex[:8]}"
    first = None
    try:
        assert main(["build", "--image", name]) == 0
        first = client.images.get(name).id
        holder = client.containers.create(first, command=["true"])  # uses the first image
        try:
            assert main(["build", "--image", name]) == 0
            second = client.images.get(name).id
            assert second != first
            assert client.images.get(first).id == first  # kept: a container still uses it
        finally:
            holder.remove(force=True)
        assert main(["build", "--image", name]) == 0
        assert client.images.get(name).id not in (first, second)
        with pytest.raises(docker.errors.ImageNotFound):  # the one it replaced is gone
            client.images.get(second)
    finally:
        for image_id in (name, first):
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(image_id, force=True)
