"""The shape of the hidden tests, for the judge (:mod:`._judge`): how they split into cases,
which names of the solution they need, and how their asserts are compiled.

Only trusted text is compiled here (the tests and the task's preamble); the solution's source
is only parsed, for its top-level names, with every parser failure caught.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Piece",
    "assigned",
    "compile_tests",
    "piece",
    "preamble_code",
    "referenced",
    "solution_names",
    "split",
]

_NO_IMPORT = {"antigravity", "this", "turtle", "turtledemo", "tkinter", "idlelib", "webbrowser"}


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _seen() -> ast.stmt:
    call = ast.Call(func=ast.Name(id="__areal_seen__", ctx=ast.Load()), args=[], keywords=[])
    return ast.Expr(value=call)


class _Asserts(ast.NodeTransformer):
    """``assert test, msg`` -> ``__areal_seen__()`` then ``if not test: __areal_fail__(msg)``:
    the same check, counted when it runs and recorded by the judge when it fails (so that a
    ``try``/``except`` of the tests around it cannot hide the failure), except that after a
    round's first unknown call (when nothing it finds counts) a failed assert lets the test go
    on, so that the rest of its calls are found in the same round.

    A function of the tests that holds a check (an ``assert``, a ``raise``, an exit with a
    status) counts as one check when it runs (``__areal_seen__()`` first thing), whether or
    not its check fires: ``def test(): if f(1) != 2: raise AssertionError`` then ``test()``,
    and a "must raise" test whose ``else: assert False`` never runs, are checks."""

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt]:
        self.generic_visit(node)
        fail = ast.Call(
            func=ast.Name(id="__areal_fail__", ctx=ast.Load()),
            args=[node.msg or ast.Constant(value=None)],
            keywords=[],
        )
        test = ast.UnaryOp(op=ast.Not(), operand=node.test)
        check = ast.If(test=test, body=[ast.Expr(value=fail)], orelse=[])
        return [ast.copy_location(_seen(), node), ast.copy_location(check, node)]

    def visit_FunctionDef(self, node: Any) -> Any:
        holds_check = _static(node.body)[0]  # before its asserts are rewritten
        self.generic_visit(node)
        if holds_check:
            first = node.body[0] if node.body else None
            docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            node.body.insert(1 if docstring else 0, ast.copy_location(_seen(), node))
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def compile_tests(tree: ast.Module | str, filename: str) -> Any:
    if isinstance(tree, str):
        tree = ast.parse(tree, filename)
    tree = ast.fix_missing_locations(_Asserts().visit(tree))
    return compile(tree, filename, "exec")


@dataclass(frozen=True)
class Piece:
    """One statement of the tests (or one test snippet), run on its own by the judge.

    ``code`` is compiled (``str``: why it does not compile); ``checks``: it holds an ``assert``,
    a ``raise`` or an exit with a status (``sys.exit``, ``exit``, ``quit``, ``os._exit``,
    ``os.abort``) outside any ``def``, ``class`` or ``lambda`` (what runs when the piece runs);
    ``stores``: the names it binds there."""

    code: Any
    checks: bool
    stores: frozenset[str]


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


_EXITS = {"exit", "quit"}
_MODULE_EXITS = {("sys", "exit"), ("os", "_exit"), ("os", "abort")}


def _exits(node: ast.AST) -> bool:
    """A call that ends the program with a status: how a test program may report a failure."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in _EXITS
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and (func.value.id, func.attr) in _MODULE_EXITS
    )


def _static(nodes: list[ast.stmt]) -> tuple[bool, frozenset[str]]:
    checks, stores = False, set()
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Assert | ast.Raise) or _exits(node):
            checks = True
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            stores.update(a.asname or a.name.split(".")[0] for a in node.names)
        if isinstance(node, _SCOPES):
            if not isinstance(node, ast.Lambda):
                stores.add(node.name)
            continue  # its body runs when it is called, not here
        stack.extend(ast.iter_child_nodes(node))
    return checks, frozenset(stores)


def piece(source: str | list[ast.stmt], filename: str) -> Piece:
    """A :class:`Piece` of a snippet (or of parsed statements); never raises."""
    try:
        body = ast.parse(source, filename).body if isinstance(source, str) else source
        checks, stores = _static(body)
        code = compile_tests(ast.Module(body=body, type_ignores=[]), filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return Piece(
            f"{filename} does not compile: {type(e).__name__}: {e}"[:500], True, frozenset()
        )
    return Piece(code, checks, stores)


def split(source: str, function: str | None) -> list[Piece] | None:
    """The statements of ``source`` (or of the body of its ``function``), each a
    :class:`Piece` (a function's docstring is skipped); ``None`` when they cannot be split."""
    tree = _parse(source)
    if tree is None:
        return None
    body: list[ast.stmt] = tree.body
    if function is not None:
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        if not found:
            return None
        body = found[-1].body
    pieces = []
    for stmt in body:
        docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        if function is not None and docstring:
            continue
        found_piece = piece([stmt], "<test>")
        if isinstance(found_piece.code, str):
            return None
        pieces.append(found_piece)
    return pieces


def solution_names(source: str) -> tuple[set[str], set[str], dict[str, str]]:
    """The solution's top-level functions, other names, and the standard-library modules it
    imports under their own names (tests written for a shared namespace use ``math`` unimported:
    the judge binds the host's own module, never one the solution chose)."""
    functions: set[str] = set()
    values: set[str] = set()
    modules: dict[str, str] = {}
    tree = _parse(source)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.add(node.name)
        elif isinstance(node, ast.ClassDef):
            values.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        values.add(sub.id)
        elif isinstance(node, ast.Import):
            for alias in node.names:  # only `import x` (x under its own name) counts
                top = alias.name.split(".")[0]
                stdlib = top in sys.stdlib_module_names and not top.startswith("_")
                if alias.asname is None and stdlib and top not in _NO_IMPORT:
                    modules[top] = top
    return functions, values - functions, modules


def assigned(sources: list[str]) -> set[str]:
    """Every name the tests bind themselves (assignments, loop and ``with`` targets, ``def``,
    ``class``, imports, ``except ... as``): the tests' own, never the solution's, even where
    they read it before they bind it."""
    names: set[str] = set()
    for source in sources:
        tree = _parse(source)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                names.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                names.update(node.names)
    return names


def referenced(sources: list[str]) -> set[str]:
    names: set[str] = set()
    for source in sources:
        tree = _parse(source)
        if tree is not None:
            names.update(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    return names


def preamble_code(source: str) -> Any:
    for text in (source, source.rstrip() + "\n    pass\n"):
        try:
            return compile(text, "<preamble>", "exec")
        except (SyntaxError, ValueError, RecursionError):
            continue
    return None
