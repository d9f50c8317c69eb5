"""What the round-3 tests run inside grading workers (module-level functions, so that a worker
can import them by name). Standard library only at import time: a pool that prepares this
module must not get sympy or reasoning-gym from it."""

from __future__ import annotations

import builtins
import contextlib
import math
import os
import socket
import subprocess
from collections.abc import Callable
from typing import Any

CANARY = "_areal_round3_canary"
PAYLOAD = f"setattr(__import__('builtins'), '{CANARY}', 1)"
#: The shapes a scorer's own pre-processing may want around an answer it evaluates.
SHAPES = (
    PAYLOAD,
    f"[{PAYLOAD}]",
    f"[[{PAYLOAD}]]",
    f"({PAYLOAD}, 1)",
    f"{PAYLOAD}\n{PAYLOAD}",
    f"1 + {PAYLOAD}",
    f"{PAYLOAD} = 1",
)


def _ran() -> bool:
    return bool(builtins.__dict__.pop(CANARY, None))


def reasoning_gym_canary(dataset: str, entry: dict[str, Any]) -> list[str]:
    """The shapes of the payload that ``dataset``'s scorer ran as Python in this process."""
    from areal_agents.rewards.logic import score_with_reasoning_gym

    ran = []
    for shape in SHAPES:
        _ran()
        with contextlib.suppress(Exception):
            score_with_reasoning_gym(dataset, shape, entry)
        if _ran():
            ran.append(shape)
    return ran


def math_canary(gold: str) -> list[str]:
    """The shapes of the payload (bare or as LaTeX text) that math-verify ran as Python."""
    from areal_agents.rewards.math import math_answer_equal

    ran = []
    for shape in (*SHAPES, f"\\text{{{PAYLOAD}}}", f"{PAYLOAD} + x"):
        _ran()
        with contextlib.suppress(Exception):
            math_answer_equal(shape, gold)
        if _ran():
            ran.append(shape)
    return ran


def sympify_in_the_job(text: str) -> str:
    """``sympy.sympify(text)``, sympy imported by this very job: ``parsed: ...``,
    ``refused: ...``, or ``RAN`` when the text ran as Python."""
    import sympy

    _ran()
    try:
        out = f"parsed: {sympy.sympify(text)}"[:200]
    except Exception as e:
        out = f"refused: {type(e).__name__}"
    return "RAN" if _ran() else out


def literal_eval_bound(module: str) -> bool:
    """Whether ``module`` (a reasoning-gym scorer) reads answers with the guarded ``eval``."""
    import importlib

    from areal_agents.rewards._harden import literal_eval

    return importlib.import_module(module).__dict__.get("eval") is literal_eval


# ---- rights -------------------------------------------------------------------------------


def _system() -> None:
    if os.system("true") != 0:
        raise PermissionError("os.system failed")


def _fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


ACTIONS: dict[str, Callable[[str], object]] = {
    "write a file": lambda d: open(os.path.join(d, "written"), "w").close(),
    "make a directory": lambda d: os.mkdir(os.path.join(d, "made")),
    "remove a file": lambda d: os.unlink(os.path.join(d, "victim")),
    "rename a file": lambda d: os.rename(os.path.join(d, "victim"), os.path.join(d, "moved")),
    "change a mode": lambda d: os.chmod(os.path.join(d, "victim"), 0o777),
    "open a socket": lambda d: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close(),
    "open a unix socket pair": lambda d: socket.socketpair(),
    "run a program": lambda d: subprocess.run(["true"], check=True),
    "run a shell": lambda d: _system(),
    "fork": lambda d: _fork(),
    "signal the zygote": lambda d: os.kill(os.getppid(), 0),
}


def attempt(action: str, directory: str) -> str:
    """``allowed``, or ``refused: <error>``: what happened when this process tried ``action``."""
    try:
        ACTIONS[action](directory)
    except BaseException as e:
        return f"refused: {type(e).__name__}"
    return "allowed"


def environment() -> dict[str, str]:
    return dict(os.environ)


def identity() -> tuple[int, int]:
    return os.getuid(), os.getgid()


def workdir() -> tuple[list[str], bool]:
    cwd = os.getcwd()
    return os.listdir(cwd), os.access(cwd, os.W_OK)


# ---- replies and state --------------------------------------------------------------------


class _RunsOnLoad:
    """Pickles as ``os.system(command)``: whoever unpickles it runs the command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def reply_that_runs(command: str) -> object:
    return _RunsOnLoad(command)


def reply_naming(name: str) -> object:
    return getattr(builtins, name)


def raise_with_a_huge_int(kind: str) -> None:
    raise getattr(builtins, kind)(10**6000)


def patch_isclose() -> bool:
    math.isclose = lambda *args, **kwargs: True  # type: ignore[assignment]
    return math.isclose(1, 2)


def isclose_is_patched() -> bool:
    return math.isclose(1, 2)
