"""The program that :mod:`areal_agents.rewards._unit_tests` runs in the sandbox: it only executes.

Its source is sent after :mod:`areal_agents.rewards._wire`'s (whose names it uses) and run with
nothing but the standard library; the host appends one line, ``main(job)``. It knows no test
and no expected value: the job holds the solution and a batch of calls ``[id, op, name, args,
kwargs]`` (arguments in wire form), and it answers each call with what happened.

Everything here runs in the same process as the program under test, which can read, patch or
bypass any of it. That is fine by design: an answer only says what the program *returned*,
and the program chooses that anyway. Forging an answer line, killing this process or printing
anything at all can change its own answers, never the verdict, which the judge on the host
reaches by running the tests against these answers. Each line written (to a private copy of
the original stdout; fd 1 and 2 are pointed at ``/dev/null``) is ``@areal:KIND ID PAYLOAD``:

* ``L - {"ok": true}`` or ``L - {"error": ..., "timeout": ...}`` once the solution ran;
* ``R id record`` after each call (``id``: its index in the batch; calls are answered in
  order, so the first call with no answer in a run that did not end is the one in flight),
  where the record is ``{"ok": value}``
  (plus ``"args"``: the arguments it changed in place), ``{"callable": true}`` (a ``get`` of a
  function), ``{"raised": [type, message]}``, ``{"timeout": true}`` (the per-call alarm) or
  ``{"unsendable": reason}`` (the value has no wire form);
* ``X -`` when the output budget is spent (the remaining calls go in a later run);
* ``D - "captured stdout tail"`` at the end.
"""

from __future__ import annotations

import builtins
import io
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # in the sandbox these come from _wire's source, sent first
    from areal_agents.rewards._wire import Unsendable, decode, dumps, encode


class _Timeout(BaseException):
    """The per-call alarm (a BaseException, so that ``except Exception`` does not eat it)."""


class _Tail:
    """A stand-in for stdout that keeps only the last characters written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: Any) -> int:
        if type(s) is str:
            self.text = (self.text + s)[-2000:]
            return len(s)
        return 0

    def flush(self) -> None:
        pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _describe(error: BaseException) -> list[str]:
    """``[name, message]``: the name of the nearest built-in class of the exception (so that
    ``class MyError(ValueError)`` is caught by ``except ValueError`` and a class merely named
    ``ZeroDivisionError`` is not), with the class's own name in front of the message."""
    t = type(error)
    own = type.__dict__["__name__"].__get__(t)
    name = "Exception"
    for k in type.__dict__["__mro__"].__get__(t):
        candidate = type.__dict__["__name__"].__get__(k)
        if type(candidate) is str and getattr(builtins, candidate, None) is k:
            name = candidate
            break
    try:
        message = str(error)
    except BaseException:  # its __str__ is the program's own code
        message = "?"
    if type(message) is not str:
        message = "?"
    if own != name:
        message = f"{own if type(own) is str else '?'}: {message}"
    return [name, message[:500]]


def _encoded_changes(values: Any, forms: list[Any]) -> dict[str, Any]:
    changed = {}
    for key, value, form in zip(range(len(forms)), values, forms, strict=False):
        if type(value) in (list, dict, set):
            new = encode(value)
            if dumps(new) != dumps(form):
                changed[str(key)] = new
    return changed


def main(job: dict[str, Any]) -> None:
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    tail = _Tail()
    sys.stdout = sys.stderr = tail
    sys.stdin = io.StringIO("")
    budget = int(job["budget"])
    used = [0]
    limit = float(job["case_timeout"])

    def emit(kind: str, ident: str, payload: str = "") -> bool:
        data = ("\n@areal:" + kind + " " + ident + " " + payload + "\n").encode()
        if used[0] + len(data) > budget and kind != "X":
            return False
        used[0] += len(data)
        while data:
            data = data[os.write(out, data) :]
        return True

    signal.signal(signal.SIGALRM, _alarm)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    load: dict[str, Any] = {"ok": True}
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            exec(compile(job["solution"], "<solution>", "exec"), namespace)
        except _Timeout:
            raise
        except BaseException as e:
            load = {"error": ": ".join(_describe(e)), "timeout": False}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:
        load = {"error": f"loading the solution took over {limit:g} s", "timeout": True}
    entry_point = job.get("entry_point")
    if "ok" in load and entry_point and entry_point not in namespace:
        load = {"error": f"the solution defines no {entry_point!r}", "timeout": False}
    emit("L", "-", dumps(load))
    if "ok" not in load:
        return

    for ident, op, name, args_form, kwargs_form in job["calls"]:
        ident = str(ident)
        try:
            record = _answer(namespace, op, name, args_form, kwargs_form, limit)
        except _Timeout:  # the alarm fired after the answer was ready
            record = {"timeout": True}
        line = dumps(record)
        if len(line) > budget // 2:
            line = dumps({"unsendable": f"an answer of {len(line)} bytes (too large)"})
        if not emit("R", ident, line):
            emit("X", "-")
            return
    emit("D", "-", dumps(tail.text))


def _answer(
    namespace: dict[str, Any], op: str, name: str, args_form: Any, kwargs_form: Any, limit: float
) -> dict[str, Any]:
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        try:
            if name not in namespace:
                raise NameError(f"name {name!r} is not defined")
            target = namespace[name]
            if op == "get":
                return {"callable": True} if callable(target) else {"ok": encode(target)}
            args, kwargs = decode(args_form), decode(kwargs_form)
            value = target(*args, **kwargs)
            record: dict[str, Any] = {"ok": encode(value)}
            changed = _encoded_changes(args, args_form[1])
            pairs = kwargs_form[1]
            named = _encoded_changes([kwargs[k] for k in kwargs], [v for _, v in pairs])
            changed.update({"k" + str(pairs[int(i)][0]): v for i, v in named.items()})
            if changed:
                record["args"] = changed
            return record
        except _Timeout:
            raise
        except Unsendable as e:
            return {"unsendable": str(e)[:300]}
        except BaseException as e:  # the program's exception is its answer
            return {"raised": _describe(e)}
    except _Timeout:
        return {"timeout": True}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
