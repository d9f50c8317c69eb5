"""make_sandbox, limits, and the Sandbox contract on the process backend (runs everywhere)."""

from __future__ import annotations

import asyncio
import time
import warnings

import pytest

from areal_agents.errors import ConfigError, ImageNotFoundError, ToolError
from areal_agents.sandboxes import (
    ExecResult,
    Sandbox,
    SandboxLimits,
    amake_sandbox,
    factory,
    make_sandbox,
    process,
)
from areal_agents.sandboxes.process import ProcessSandbox


def test_unknown_backend_names_the_choices():
    with pytest.raises(ConfigError, match="did you mean 'docker'"):
        make_sandbox("dokcer")


def test_unknown_limit_is_a_config_error():
    with pytest.raises(ConfigError, match="memory_mb"):
        make_sandbox("process", memroy_mb=5)


def test_non_positive_limit_is_rejected():
    with pytest.raises(ConfigError, match="pids=0"):
        SandboxLimits(pids=0)


def test_auto_falls_back_to_process_with_one_loud_warning(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(factory, "docker_problem", lambda image=None: "no engine (test)")
    monkeypatch.setattr(factory, "bubblewrap_problem", lambda: "no bwrap (test)")
    monkeypatch.setattr(process, "_warned", False)
    with pytest.warns(RuntimeWarning, match="NOT isolation"):
        sb = make_sandbox("auto")
    assert isinstance(sb, ProcessSandbox)
    sb.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_sandbox("auto").close()  # the warning is once per process


def test_process_sandbox_satisfies_the_protocol_and_runs_code():
    with make_sandbox("process") as sb:
        assert isinstance(sb, Sandbox)
        res = sb.run_python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)")
    assert isinstance(res, ExecResult)
    assert (res.stdout, res.stderr, res.exit_code, res.ok) == ("out\n", "err\n", 3, False)


def test_files_round_trip_and_paths_stay_inside():
    with make_sandbox("process") as sb:
        sb.write_file("sub/data.bin", b"\x00\xffdata")
        assert sb.read_file("sub/data.bin") == b"\x00\xffdata"
        assert sb.run("cat sub/data.bin | wc -c").stdout.strip() == "6"
        with pytest.raises(ToolError, match="outside"):
            sb.write_file("../escape.txt", "x")
        with pytest.raises(ToolError, match="no such file"):
            sb.read_file("missing.txt")
        sb.run("ln -s /etc/passwd link")
        with pytest.raises(ToolError):
            sb.read_file("link")  # a symlink planted by the program does not lead out


def test_stdin_reaches_the_command():
    with make_sandbox("process") as sb:
        assert sb.run("tr a-z A-Z", stdin="hello").stdout == "HELLO"


def test_timeout_is_reported_and_sandbox_stays_usable():
    with make_sandbox("process") as sb:
        res = sb.run("sleep 30", timeout=0.5)
        assert res.timed_out and res.duration_s < 10
        assert sb.run("echo ok").stdout == "ok\n"


def test_output_is_capped_and_flagged():
    with make_sandbox("process", max_output_bytes=1000) as sb:
        res = sb.run_python("print('x' * 5000)")
    assert res.truncated and len(res.stdout) == 1000


def test_reset_empties_the_work_dir():
    with make_sandbox("process") as sb:
        sb.write_file("a.txt", "1")
        sb.reset()
        assert sb.run("ls -A").stdout == ""


def test_closed_sandbox_refuses_work_and_close_is_idempotent():
    sb = make_sandbox("process")
    sb.close()
    sb.close()
    from areal_agents.errors import SandboxError

    with pytest.raises(SandboxError):
        sb.run("true")


async def test_async_variants_do_not_block_the_event_loop():
    sb = await amake_sandbox("process")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    start = time.monotonic()
    res = await sb.arun("sleep 0.5; echo done")
    task.cancel()
    await sb.aclose()
    assert res.stdout == "done\n" and time.monotonic() - start >= 0.5
    assert ticks >= 10  # the loop kept running while the command blocked a worker thread


@pytest.mark.docker
def test_missing_image_is_a_clear_error_without_a_pull():
    with pytest.raises(ImageNotFoundError, match=r"areal_agents\.sandbox build"):
        make_sandbox("docker", image="areal-agents-no-such-image:never")
