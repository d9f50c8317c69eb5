"""The test runner that :mod:`areal_agents.rewards.code` sends into a sandbox.

This file is sent as source text and run with nothing but the standard library. The host
appends one line that calls :func:`main` with the job (solution, tests, nonce, limits). It
prints one line per event, each starting with the nonce, so that output the solution prints
itself cannot be mistaken for a result:

* ``{"event": "loaded"}`` or ``{"event": "load_error", "error": ...}`` after the solution ran;
* ``{"event": "plan", "total": n}`` once the tests are split into ``n`` cases;
* ``{"event": "case", "index": i, "ok": ..., "timeout": ..., "error": ...}`` per test case
  (with ``fail_fast``, none after the first failing one);
* ``{"event": "done", "stdout": ...}`` at the end.

Tests come in three shapes (``mode``): ``cases`` (a list of snippets, each one case),
``check`` (a HumanEval-style program defining ``check(candidate)``: each top-level statement of
``check`` that contains an ``assert`` is one case, the others are set-up), and ``program`` (a
test program whose top-level statements with an ``assert`` are the cases).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import signal
import sys
from typing import Any


class CaseTimeout(BaseException):
    """Raised by the alarm inside a case; a BaseException so ``except Exception`` cannot eat it."""


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout()


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text[:500]


def _split(source: str, function: str | None) -> list[tuple[bool, Any]] | None:
    """``[(is_case, code)]`` for the statements of ``source`` (or of its ``function``)."""
    tree = ast.parse(source)
    body: list[ast.stmt] = tree.body
    if function is not None:
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        if not found:
            return None
        body = found[-1].body
    pieces = []
    for stmt in body:
        if (
            function is not None
            and isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
        ):
            continue  # a docstring
        is_case = any(isinstance(node, ast.Assert) for node in ast.walk(stmt))
        module = ast.Module(body=[stmt], type_ignores=[])
        pieces.append((is_case, compile(module, "<test>", "exec")))
    return pieces


def main(job: dict[str, Any]) -> None:
    nonce: str = job["nonce"]
    case_timeout: float = float(job["case_timeout"])
    out_fd = os.dup(1)

    def emit(**event: Any) -> None:
        os.write(out_fd, ("\n" + nonce + json.dumps(event) + "\n").encode())

    signal.signal(signal.SIGALRM, _alarm)
    captured = io.StringIO()
    sys.stdin = io.StringIO("")
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}

    def run(code: Any) -> tuple[bool, bool, str | None]:
        signal.setitimer(signal.ITIMER_REAL, case_timeout)
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                exec(code, namespace)
        except CaseTimeout:
            return False, True, f"timed out after {case_timeout:g} s"
        except BaseException as e:
            return False, False, _describe(e)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return True, False, None

    try:
        solution = compile(job["solution"], "<solution>", "exec")
    except SyntaxError as e:
        emit(event="load_error", error=_describe(e), timeout=False)
        emit(event="done", stdout="")
        return
    ok, timeout, error = run(solution)
    if not ok:
        emit(event="load_error", error=error, timeout=timeout)
        emit(event="done", stdout=captured.getvalue()[-2000:])
        return
    entry_point = job.get("entry_point")
    if entry_point and entry_point not in namespace:
        emit(event="load_error", error=f"the solution defines no {entry_point!r}", timeout=False)
        emit(event="done", stdout=captured.getvalue()[-2000:])
        return
    emit(event="loaded")

    mode = job["mode"]
    if mode == "cases":
        pieces: list[tuple[bool, Any]] = []
        for i, case in enumerate(job["tests"]):
            try:
                pieces.append((True, compile(case, f"<test {i}>", "exec")))
            except SyntaxError as e:
                pieces.append((True, SyntaxError(f"test {i} does not compile: {e}")))
    else:
        source = job["tests"]
        if mode == "check":
            ok, timeout, error = run(compile(source, "<test>", "exec"))
            if not ok:
                emit(event="load_error", error=f"test program: {error}", timeout=timeout)
                emit(event="done", stdout=captured.getvalue()[-2000:])
                return
            namespace["candidate"] = namespace[entry_point] if entry_point else None
        try:
            split = _split(source, "check" if mode == "check" else None)
        except SyntaxError:
            split = None
        if split is None:  # cannot split: the whole check is one case
            call = "check(candidate)" if mode == "check" else source
            split = [(True, compile(call, "<test>", "exec"))]
        pieces = split

    emit(event="plan", total=sum(1 for is_case, _ in pieces if is_case))
    fail_fast = bool(job.get("fail_fast"))
    index = 0
    setup_error: str | None = None
    for is_case, code in pieces:
        if not is_case:
            if setup_error is None:
                ok, timeout, error = run(code)
                if not ok:
                    setup_error = f"test set-up failed: {error}"
            continue
        if setup_error is not None:
            emit(event="case", index=index, ok=False, timeout=False, error=setup_error)
        elif isinstance(code, SyntaxError):
            emit(event="case", index=index, ok=False, timeout=False, error=str(code))
        else:
            ok, timeout, error = run(code)
            emit(event="case", index=index, ok=ok, timeout=timeout, error=error)
            if fail_fast and not ok:
                break
        index += 1
    emit(event="done", stdout=captured.getvalue()[-2000:])
