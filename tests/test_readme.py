"""The README, tried as a new user would: every snippet runs as written, every command is tried.

Every fenced block of ``README.md`` and ``examples/*/README.md`` is read here:

* ``python`` blocks run in a fresh interpreter (this one: the project's venv), from a
  directory outside the repository. A ``print(...)  # EXPECTED`` line in a block is an
  assertion: ``EXPECTED`` (``...`` matches anything) must appear in what the block printed.
* ``bash`` blocks hold commands only; each command is exercised the way ``COMMANDS`` below
  says, first matching row wins, and a command that matches no row fails the test (so a new
  command in the docs needs a row here).
* ``text`` blocks that hold ``key=value`` lines are overrides: they must be valid keys and
  values of ``python -m areal_agents.train``.

The docs' fixed ports (8000, 8100, ...) are rewritten to free ones. Commands run from a
temporary directory, except the ones that name the repository's ``examples`` package, which
the docs say to run from the repository root. ``PYTHONPATH`` points at this checkout, so that
the code under test is this checkout's even where the venv holds another editable install.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from areal_agents.net import free_port
from tests._doc_blocks import Block, Command, read_blocks, shell_commands
from tests._train_run import TINY_SIZES

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", *sorted(ROOT.glob("examples/*/README.md")))
DOC_PORTS = (8000, 8100, 8101, 8102)
PORTS = {port: free_port() for port in DOC_PORTS}
READY_S = 240  # a server must print its ready line within this (busy 2-core CI machines)
RUN_S = 300

# Tiny settings appended to the commands that are run for real (later overrides win).
TINY_TRAIN = ("trainer.total_steps=1", *TINY_SIZES, "eval.held_out_tasks=2")
TINY_EVAL = (
    "num_episodes=2",
    "samples_per_task=2",
    "concurrency=2",
    "policy.max_tokens=16",
    "progress=false",
)

# How each shell command of the docs is exercised; the first row whose pattern matches wins.
#   syntax  `bash -n`: parsed, not run
#   help    `--help` appended: the command exists and parses its arguments
#   check   `--check` appended: keys, values and the environment validated, nothing started
#   run     run as written (ports rewritten), with the row's tiny overrides appended
#   serve   started as written; it must print its ready line; then stopped with SIGTERM
COMMANDS: list[tuple[str, str, str]] = [
    (r"--help\b", "run", "help output is what the command prints"),
    (r"^bash scripts/", "syntax", "installs packages (and test.sh is the whole suite: CI runs it)"),
    (
        r"examples\.cpu_quickstart\.run",
        "help",
        "15 min of RL by design (benchmarks/)",
    ),
    (
        r"areal_agents\.sandbox build",
        "help",
        "would rebuild the image that other tests use at"
        " the same moment; scripts/services.sh builds it, tests/sandboxes/test_cli.py rebuilds a"
        " private tag",
    ),
    (r"areal_agents\.sandbox ", "run", "seconds"),
    (r"areal_agents\.(serving|envs)\.serve ", "serve", "seconds to ready"),
    (r"areal_agents\.train .*inference=vllm", "check", "vLLM needs its own venv and a GPU"),
    (r"areal_agents\.train .*ray\.address=", "check", "needs a running Ray cluster"),
    (r"areal_agents\.train .*env=remote:", "run", "one tiny training run (then a re-run)"),
    (r"areal_agents\.train ", "check", "minutes each; the tiny run above covers the trainer"),
    (r"areal_agents\.eval ", "run", "tiny: 2 episodes of 16 tokens per turn"),
    (r"areal_agents\.simulate ", "run", "seconds: the time is simulated"),
]

# The servers the later commands and snippets talk to, started from the docs' own commands.
MODEL_SERVER = re.compile(r"areal_agents\.serving\.serve .*--port 8000")
ENV_SERVER = re.compile(r"areal_agents\.envs\.serve env=calculator .*--port 8100")


def tiny_model_server() -> list[str]:
    """Appended to the model server's command: the tiny random model of the default one's
    architecture and tokenizer under the default's name, so that the eval commands run as
    written and fast (a 135M model on two busy cores takes a minute per command)."""
    from areal_agents.serving.model import DEFAULT_MODEL_NAME
    from areal_agents.trainers.modeling import tiny_model_path

    return ["--model", str(tiny_model_path()), "--served-model-name", DEFAULT_MODEL_NAME]


BLOCKS = read_blocks(DOCS, ROOT)
PYTHON_BLOCKS = [b for b in BLOCKS if b.lang == "python"]
SHELL_COMMANDS = [c for b in BLOCKS if b.lang == "bash" for c in shell_commands(b)]
NEEDS_DOCKER = re.compile(r"docker|code_sandbox|make_sandbox|areal_agents\.sandbox ")


def params(items: list[Any], text: Any, name: Any) -> list[Any]:
    """``items`` as pytest params, marked ``docker`` where their text needs the engine."""
    return [
        pytest.param(
            item,
            id=name(item),
            marks=[pytest.mark.docker] if NEEDS_DOCKER.search(text(item)) else [],
        )
        for item in items
    ]


def localize(text: str) -> str:
    """The docs' fixed ports replaced by free ones."""
    for doc_port, port in PORTS.items():
        text = re.sub(rf"\b{doc_port}\b", str(port), text)
    return text


def find_rule(command: Command) -> tuple[str, str] | None:
    """``(mode, why)`` of the first row of COMMANDS that matches ``command``."""
    for pattern, mode, why in COMMANDS:
        if re.search(pattern, command.text):
            return mode, why
    return None


def rule(command: Command) -> tuple[str, str]:
    found = find_rule(command)
    assert found, f"{command.id}: no row of COMMANDS says how to try {command.text!r}"
    return found


def child_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    }


def cwd_for(text: str, outside: Path) -> Path:
    """The repository root for what names its ``examples`` package or directory (as the docs
    say), else a directory outside the repository."""
    return ROOT if re.search(r"\bexamples[./]", text) else outside


def argv_of(command: Command) -> list[str]:
    argv = shlex.split(localize(command.text))
    if argv[0] == "python":
        argv[0] = sys.executable
    return argv


def run(argv: list[str], cwd: Path, timeout: float = RUN_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout
    )


def ok(proc: subprocess.CompletedProcess[str], what: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{out[-4000:]}"
    assert "Traceback" not in out, f"{what}: a traceback\n{out[-4000:]}"
    return proc.stdout


# ---- servers ------------------------------------------------------------------------------


class Server:
    """A command that serves until stopped; ``ready`` is its first line that says so."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put("")

    def wait_ready(self, timeout: float = READY_S) -> str:
        """The line that says it listens (``serving ... at http://...``), or a failure."""
        with contextlib.suppress(queue.Empty):
            while True:
                line = self.lines.get(timeout=timeout)
                if not line:
                    break
                if re.match(r"serving .* at http://127\.0\.0\.1:\d+", line):
                    return line
        raise AssertionError(f"no ready line; output:\n{''.join(self.output)[-4000:]}")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 30 s; then whatever the server started in its session
        (its process group: engine or worker children) is killed too, so nothing outlives
        the test."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group we started (new session)
        return code


def find_command(pattern: re.Pattern[str]) -> Command:
    found = [c for c in SHELL_COMMANDS if pattern.search(c.text)]
    assert found, f"the docs no longer show a command like {pattern.pattern!r}"
    return found[0]


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("user")


@pytest.fixture(scope="module")
def servers(outside: Path) -> Iterator[dict[Command, str]]:
    """The docs' model server and environment server, started as written (free ports)."""
    started: dict[Command, Server] = {}
    try:
        for pattern in (MODEL_SERVER, ENV_SERVER):  # both load at once
            command = find_command(pattern)
            tiny = tiny_model_server() if pattern is MODEL_SERVER else []
            started[command] = Server([*argv_of(command), *tiny], cwd_for(command.text, outside))
        yield {command: server.wait_ready() for command, server in started.items()}
    finally:
        for server in started.values():
            server.stop()


@dataclass
class Started:
    """A command started ahead of its test (slow start-ups overlap); ``result`` waits for it."""

    proc: subprocess.Popen[str]
    args: list[str]

    def result(self) -> subprocess.CompletedProcess[str]:
        stdout, stderr = self.proc.communicate(timeout=RUN_S)
        return subprocess.CompletedProcess(self.args, self.proc.returncode, stdout, stderr)


def _planned(command: Command, base: Path) -> list[str] | None:
    """The arguments a slow command is started with ahead of its test, or None."""
    mode = (find_rule(command) or ("", ""))[0]  # no row: its own test says so
    if mode == "check":
        return [*argv_of(command), "--check"]
    if mode == "run" and "areal_agents.train" in command.text and "--help" not in command.text:
        return [*argv_of(command), *TINY_TRAIN, f"output_dir={base / 'run'}"]
    return None


@pytest.fixture(scope="module")
def started(
    servers: dict[Command, str], outside: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Command, Started]]:
    """The tiny training run and the ``--check`` commands, all started at once (each takes
    seconds of imports, the training run a minute of start-up), once the servers are up."""
    out: dict[Command, Started] = {}
    try:
        for command in SHELL_COMMANDS:
            base = tmp_path_factory.mktemp("cmd")
            args = _planned(command, base)
            if args is not None:
                proc = subprocess.Popen(
                    args,
                    cwd=cwd_for(command.text, outside),
                    env=child_env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                out[command] = Started(proc, args)
        yield out
    finally:
        for job in out.values():
            if job.proc.poll() is None:
                job.proc.terminate()
                job.proc.communicate(timeout=60)


# ---- the tests ----------------------------------------------------------------------------


def test_the_docs_are_found_and_fenced_by_what_they_hold() -> None:
    assert len(DOCS) >= 3 and len(PYTHON_BLOCKS) >= 6 and len(SHELL_COMMANDS) >= 20
    for block in BLOCKS:
        where = f"{block.doc}:{block.line}"
        assert block.lang in ("python", "bash", "text", ""), f"{where}: fence {block.lang!r}"
    for command in SHELL_COMMANDS:
        # an override line fenced as bash gives `command not found` when pasted: fence as text
        assert command.argv[0] in ("python", "bash"), f"{command.id}: not a command; use text"
        rule(command)


def test_override_blocks_are_valid_train_keys() -> None:
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig

    override = re.compile(r"^[a-z_]+(\.[a-z_]+)*=\S+$")
    checked = 0
    for block in (b for b in BLOCKS if b.lang == "text"):
        for raw in block.text.splitlines():
            try:
                words = shlex.split(raw, comments=True)
            except ValueError:  # an unpaired quote (a closing screen's "RL's"): not overrides
                continue
            if words and all(override.match(w) for w in words):
                load_config(TrainConfig, words)  # a bad key or value raises, naming it
                checked += 1
    assert checked >= 4


@pytest.mark.parametrize(
    "block", params(PYTHON_BLOCKS, lambda b: b.text, lambda b: f"{b.doc}:{b.line}")
)
def test_python_block_runs(
    block: Block,
    servers: dict[Command, str],
    started: dict[Command, Started],
    outside: Path,
    tmp_path: Path,
) -> None:
    """(``started``: the slow commands start now, and run while the snippets do; ``servers``:
    a snippet may talk to the docs' model or environment server, as the docs say to start.)"""
    script = tmp_path / "snippet.py"
    script.write_text(localize(block.text))
    stdout = ok(run([sys.executable, str(script)], cwd_for(block.text, outside)), block.doc)
    for expected in re.findall(r"^\s*print\(.*\)\s+#\s*(.+?)\s*$", block.text, re.M):
        pattern = ".*".join(re.escape(part) for part in expected.split("..."))
        assert re.search(pattern, stdout), f"expected {expected!r} in the output:\n{stdout}"


@pytest.mark.parametrize("command", params(SHELL_COMMANDS, lambda c: c.text, lambda c: c.id))
def test_shell_command(
    command: Command,
    servers: dict[Command, str],
    started: dict[Command, Started],
    outside: Path,
    tmp_path: Path,
) -> None:
    mode, _ = rule(command)
    cwd = cwd_for(command.text, outside)
    argv = argv_of(command)
    if mode == "syntax":
        script = ROOT / command.argv[1]
        ok(run(["bash", "-n", str(script)], cwd), command.id)
    elif mode == "help":
        assert "usage" in ok(run([*argv, "--help"], cwd, timeout=60), command.id).lower()
    elif mode == "check":
        assert "configuration OK" in ok(started[command].result(), command.id)
    elif mode == "serve":
        if command in servers:  # started by the fixture, which waited for its ready line
            assert f"127.0.0.1:{PORTS[int(command.argv[-1])]}" in servers[command]
            return
        server = Server(argv, cwd)
        try:
            server.wait_ready()
        finally:
            assert server.stop() in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
    elif "areal_agents.train" in command.text and "--help" not in argv:
        _train_twice(command, started[command], cwd)
    elif "areal_agents.eval" in command.text and "--help" not in argv:
        _eval_twice(command, argv, cwd, tmp_path)
    else:
        _check_output(command, ok(run(argv, cwd), command.id))


def _check_output(command: Command, stdout: str) -> None:
    """What a command that only prints must print."""
    if "areal_agents.train --help" in command.text:
        assert "config=FILE.yaml" in stdout and "trainer.total_steps=" in stdout
    elif "areal_agents.eval --help" in command.text:
        assert "policy.max_tokens=512" in stdout and "outputs/eval/<date>/<time>_" in stdout
    elif "sandbox run" in command.text:
        assert stdout == "2\n"
    elif "sandbox doctor" in command.text:
        assert "backend='auto' picks" in stdout
    elif "areal_agents.simulate" in command.text:
        assert "sync " in stdout and "async s=8" in stdout and "vs sync" in stdout


def _train_twice(command: Command, first_run: Started, cwd: Path) -> None:
    args = first_run.args
    run_dir = args[-1].removeprefix("output_dir=")
    done = first_run.result()
    first = ok(done, command.id)
    assert f"results in {run_dir}" in first
    assert "authentication" not in (first + done.stderr).lower()  # Ray's token warning: silenced
    assert (Path(run_dir) / "report.html").is_file()
    again = ok(run(args, cwd), f"{command.id} (again)")
    assert "already complete" in again and "run directory:" not in again, again


def _eval_twice(command: Command, argv: list[str], cwd: Path, tmp_path: Path) -> None:
    """The command as written, twice in a row from the same folder: each run gets a folder of
    its own (``outputs/eval/<date>/<time>_<env>_<model>``); given that folder as ``output_dir``,
    a third run is refused, as it would overwrite the results."""
    import json

    args = [*argv, *TINY_EVAL]
    folders = []
    for attempt in ("first", "again"):
        out = ok(run(args, cwd), f"{command.id} ({attempt})")
        found = re.search(r"^results in (\S+): summary\.json", out, re.M)
        assert found, out[-2000:]
        folders.append(Path(found.group(1)))
    assert folders[0] != folders[1] and folders[0].parent.parent == cwd.resolve() / "outputs/eval"
    summary: dict[str, Any] = json.loads((folders[0] / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["sampling"]["temperature"] == 1.0
    again = run([*args, f"output_dir={folders[1]}"], cwd)  # must not overwrite the results
    assert again.returncode == 2 and "already holds an evaluation" in again.stderr, again.stderr
