"""The shape of the hidden tests, for the judge (:mod:`._judge`): how they split into cases,
which names of the solution they need, and how their asserts are compiled.

Only trusted text is compiled here (the tests and the task's preamble); the solution's source
is only parsed, for its top-level names, with every parser failure caught.
"""

from __future__ import annotations

import ast
import sys
from typing import Any

__all__ = ["compile_tests", "preamble_code", "referenced", "solution_names", "split"]

_NO_IMPORT = {"antigravity", "this", "turtle", "turtledemo", "tkinter", "idlelib", "webbrowser"}


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


class _Asserts(ast.NodeTransformer):
    """``assert test, msg`` -> ``if not test: __areal_fail__(msg)``: the same check, except that
    after a round's first unknown call (when nothing it finds counts) a failed assert lets the
    test go on, so that the rest of its calls are found in the same round."""

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.generic_visit(node)
        fail = ast.Call(
            func=ast.Name(id="__areal_fail__", ctx=ast.Load()),
            args=[node.msg or ast.Constant(value=None)],
            keywords=[],
        )
        test = ast.UnaryOp(op=ast.Not(), operand=node.test)
        return ast.copy_location(ast.If(test=test, body=[ast.Expr(value=fail)], orelse=[]), node)


def compile_tests(tree: ast.Module | str, filename: str) -> Any:
    if isinstance(tree, str):
        tree = ast.parse(tree, filename)
    tree = ast.fix_missing_locations(_Asserts().visit(tree))
    return compile(tree, filename, "exec")


def split(source: str, function: str | None) -> list[tuple[bool, Any]] | None:
    """``[(is_case, code)]`` for the statements of ``source`` (or of its ``function``)."""
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
    try:
        for stmt in body:
            docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            if function is not None and docstring:
                continue
            is_case = any(isinstance(node, ast.Assert) for node in ast.walk(stmt))
            module = ast.Module(body=[stmt], type_ignores=[])
            pieces.append((is_case, compile_tests(module, "<test>")))
    except (SyntaxError, ValueError, RecursionError):
        return None
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
