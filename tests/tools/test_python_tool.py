"""The python/bash tools and the per-episode sandbox holder (opened on use, closed on close and
on garbage collection)."""

from __future__ import annotations

import gc

import pytest

from areal_agents.errors import ConfigError, SandboxError, ToolError, ToolTimeout
from areal_agents.sandboxes import ExecResult
from areal_agents.tools import BashTool, EpisodeSandbox, PythonTool, format_exec_result

BACKENDS = ["process", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_tool_reports_stdout_stderr_and_exit_status(backend: str) -> None:
    with EpisodeSandbox(backend) as box:
        tool = PythonTool(box, timeout_s=5)
        assert tool.call({"code": "print(sum(range(10)))"}) == "exit code 0\nstdout:\n45"
        out = tool.call({"code": "import sys\nprint('partial')\nsys.exit(3)"})
        assert out.startswith("exit code 3") and "partial" in out
        err = tool.call({"code": "1/0"})
        assert err.startswith("exit code 1") and "ZeroDivisionError" in err
        assert "no output" in tool.call({"code": "x = 1"})
        # files persist between calls, interpreter state does not
        tool.call({"code": "open('note.txt', 'w').write('kept')"})
        assert "kept" in tool.call({"code": "print(open('note.txt').read())"})
        assert "NameError" in tool.call({"code": "print(x)"})


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_tool_time_limit_and_output_cap(backend: str) -> None:
    with EpisodeSandbox(backend) as box:
        tool = PythonTool(box, timeout_s=1, max_output_chars=100)
        with pytest.raises(ToolTimeout) as killed:  # counted as a 'timeout' tool error
            tool.call({"code": "while True: pass"})
        assert killed.value.output.startswith("timed out")
        out = tool.call({"code": "print('x' * 5000)"})
        assert "more characters" in out and len(out) < 300


def test_bad_inputs_are_tool_errors() -> None:
    with EpisodeSandbox("process") as box:
        with pytest.raises(ToolError, match="empty"):
            PythonTool(box).call({"code": "   "})
        with pytest.raises(ToolError, match="longer"):
            PythonTool(box, max_code_chars=10).call({"code": "print(1)  # long comment"})
        with pytest.raises(ToolError, match="empty"):
            BashTool(box).call({"command": ""})


def test_bash_tool_runs_in_the_work_directory() -> None:
    with EpisodeSandbox("process") as box:
        bash = BashTool(box)
        bash.call({"command": "echo hello > f.txt"})
        assert bash.call({"command": "cat f.txt"}) == "exit code 0\nstdout:\nhello"


def test_episode_sandbox_opens_lazily_and_closes() -> None:
    box = EpisodeSandbox("process")
    assert not box.is_open
    first = box.get()
    assert box.is_open and box.get() is first
    box.close()
    assert not box.is_open
    with pytest.raises(SandboxError):
        first.run("true")  # the old sandbox is really closed
    second = box.get()
    assert second is not first
    box.close()
    box.close()  # twice is fine


def test_episode_sandbox_is_closed_by_garbage_collection() -> None:
    box = EpisodeSandbox("process")
    sandbox = box.get()
    sandbox.run("true")
    del box
    gc.collect()
    with pytest.raises(SandboxError):
        sandbox.run("true")


def test_unknown_backend_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match="dockr"):
        EpisodeSandbox("dockr")


def test_format_exec_result_statuses() -> None:
    assert format_exec_result(ExecResult("", "", 137, oom_killed=True)).startswith("killed: out")
    assert "[output truncated" in format_exec_result(ExecResult("a", "", 0, truncated=True))


def test_a_turn_budget_can_only_shorten_the_tool_limit() -> None:
    with EpisodeSandbox("process") as box:
        tool = PythonTool(box, timeout_s=30)
        with pytest.raises(ToolTimeout) as killed:
            tool.call({"code": "import time; time.sleep(60)"}, timeout_s=0.5)
        out = killed.value.output
        assert out.startswith("timed out") and "turn's tool time budget" in out
        # a larger budget does not lift the tool's own limit
        quick = PythonTool(box, timeout_s=0.5)
        with pytest.raises(ToolTimeout) as killed:
            quick.call({"code": "import time; time.sleep(60)"}, timeout_s=100)
        assert killed.value.output.startswith("timed out") and "budget" not in killed.value.output
        bash = BashTool(box, timeout_s=30)
        with pytest.raises(ToolTimeout, match=r"^timed out"):
            bash.call({"command": "sleep 60"}, timeout_s=0.5)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"memroy_mb": 256}, "unknown option 'memroy_mb' (did you mean 'memory_mb'?)"),
        ({"imgae": "x"}, "did you mean 'image'"),
        ({"memory_mb": -1}, "memory_mb=-1"),
        ({"memory_mb": "256"}, "memory_mb='256'"),
        ({"pids": True}, "'pids']=True"),
        ({"cpus": float("nan")}, "'cpus']=nan"),
        ({"pool_size": 0}, "pool_size"),
        ({"image": 5}, "'image']=5"),
        ("memory_mb=256", "must be a dict"),
    ],
)
def test_sandbox_options_are_checked_at_construction(options: object, needle: str) -> None:
    with pytest.raises(ConfigError) as raised:
        EpisodeSandbox("process", options)  # type: ignore[arg-type]
    assert needle in str(raised.value)
    assert EpisodeSandbox("process", {"memory_mb": 256, "image": "x", "pool_size": 2}).options


@pytest.mark.parametrize("timeout_s", [0, -1, "10", float("inf")])
def test_tool_time_limits_are_checked(timeout_s: object) -> None:
    with EpisodeSandbox("process") as box, pytest.raises(ConfigError, match="timeout_s"):
        PythonTool(box, timeout_s=timeout_s)  # type: ignore[arg-type]
