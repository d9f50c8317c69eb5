"""Third-party graders made safe to feed model text: no answer is run as Python.

Some verifiers evaluate the answer they score. reasoning-gym's ``countdown``, ``puzzle24``,
``simple_integration``, ``intermediate_integration`` and ``polynomial_multiplication`` call
sympy's ``parse_expr`` (which turns the text into Python and ``eval``\\ s it), and
``binary_matrix``, ``n_queens``, ``spiral_matrix`` and ``string_insertion`` call ``eval`` on the
answer itself. So ``<answer>__import__('os').system(...)</answer>`` ran, and an answer could
patch the scorer (``numpy.isclose``) and score its own wrong result 1.0.

:func:`install` applies them in the grading zygote (:mod:`._grader`), never in the calling
process, first to what is loaded, then through an import hook to each such module as soon as
it is imported, in the zygote or during a grade (a test that runs ``import sympy`` and then
``sympy.sympify`` of a string the solution returned, in the round whose answers are known);
:func:`harden` applies them again before every job:

* sympy's ``stringify_expr`` (the step of ``parse_expr`` and of ``sympify`` of a string that
  writes the Python to evaluate) is wrapped: the code it wrote is parsed and refused
  (``ValueError``) unless it is arithmetic on numbers and symbols, calls of a fixed list of
  mathematical functions (:data:`MATH_NAMES`), and names the caller passed in ``local_dict``.
  No attribute, subscript, lambda, comprehension, keyword, dunder name, builtin (``eval``,
  ``getattr``, ``open``, ``__import__``...) or string (other than a symbol's name or a number's
  digits) gets through. Scorers catch the error and score the answer as unreadable.
* in every loaded ``reasoning_gym`` module, the name ``eval`` is bound to :func:`literal_eval`:
  literals (numbers, strings, lists, tuples, sets, dicts) and operators on them only, which
  is what those scorers read (``"['a', 'b']"``).

math-verify needs no change: it parses LaTeX with its own parser, and the plain expressions it
hands to ``parse_expr`` are cut by a regular expression to digits and operators; the guard
applies to them too.
"""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import importlib.machinery
import re
import sys
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["MATH_NAMES", "check_sympy_code", "harden", "install", "literal_eval"]

#: What sympy-parsed text may call or name besides the caller's ``local_dict``.
MATH_NAMES = frozenset(
    [
        "Symbol",
        "Function",
        "Integer",
        "Float",
        "Rational",
        "pi",
        "E",
        "I",
        "oo",
        "zoo",
        "nan",
        "EulerGamma",
        "GoldenRatio",
        "Catalan",
        "sqrt",
        "cbrt",
        "root",
        "real_root",
        "exp",
        "log",
        "ln",
        "LambertW",
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "asin",
        "acos",
        "atan",
        "acot",
        "asec",
        "acsc",
        "atan2",
        "sinh",
        "cosh",
        "tanh",
        "coth",
        "sech",
        "csch",
        "asinh",
        "acosh",
        "atanh",
        "acoth",
        "Abs",
        "abs",
        "sign",
        "floor",
        "ceiling",
        "frac",
        "Max",
        "Min",
        "max",
        "min",
        "re",
        "im",
        "arg",
        "conjugate",
        "factorial",
        "factorial2",
        "binomial",
        "gamma",
        "beta",
        "erf",
        "erfc",
        "Mod",
        "gcd",
        "lcm",
        "pow",
        "round",
        "Add",
        "Mul",
        "Pow",
        "Eq",
        "Ne",
        "Lt",
        "Le",
        "Gt",
        "Ge",
    ]
)
_NAMED_BY_STRING = {"Symbol", "Function"}
_NUMBER_BY_STRING = {"Integer", "Float", "Rational"}
_NUMBER_TEXT = re.compile(r"[0-9_]*\.?[0-9_]*(?:[eE][+-]?[0-9_]+)?\Z")
_PLAIN = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.Tuple,
    ast.List,
    ast.Load,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
)


def _string_allowed(function: str, text: str) -> bool:
    if len(text) > 2000:
        return False
    if function in _NAMED_BY_STRING:
        return text.isidentifier() and not text.startswith("_")
    return function in _NUMBER_BY_STRING and bool(text) and _NUMBER_TEXT.match(text) is not None


def check_sympy_code(code: str, local_dict: Mapping[str, Any] | None) -> None:
    """Refuse (``ValueError``) Python that sympy wrote from model text unless it is plain
    mathematics (see the module docstring)."""
    try:
        tree = ast.parse(code.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"not an expression: {type(e).__name__}") from None
    local = local_dict or {}
    strings_ok: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if not isinstance(func, ast.Name) or node.keywords:
                raise ValueError("only plain calls of mathematical functions are allowed")
            for arg in node.args:
                if isinstance(arg, ast.Starred):
                    raise ValueError("starred arguments are not allowed")
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    if not _string_allowed(func.id, arg.value):
                        raise ValueError(f"{func.id} may not be given this text")
                    strings_ok.add(id(arg))
        elif isinstance(node, ast.Name):
            name = node.id
            if name.startswith("__") or not (name in local or name in MATH_NAMES):
                raise ValueError(f"the name {name[:40]!r} is not allowed in an answer")
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, str):
                if id(node) not in strings_ok:
                    raise ValueError("text is not allowed in an answer")
            elif not (value is None or isinstance(value, bool | int | float | complex)):
                raise ValueError(f"a constant of type {type(value).__name__} is not allowed")
        elif not isinstance(node, _PLAIN):
            raise ValueError(f"{type(node).__name__} is not allowed in an answer")


_LITERAL = (
    ast.Expression,
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.UnaryOp,
    ast.BinOp,
    ast.BoolOp,
    ast.Compare,
    ast.Load,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
)


def literal_eval(source: Any, globals: Any = None, locals: Any = None) -> Any:
    """``eval`` for literals and operators on them (no name, call or attribute): what the
    reasoning-gym scorers that ``eval`` an answer get instead. Raises ``ValueError``."""
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    if not isinstance(source, str):
        raise ValueError("only text is evaluated")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as e:
        raise ValueError(f"not a literal: {type(e).__name__}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _LITERAL):
            raise ValueError(f"{type(node).__name__} is not allowed in an answer")
        if isinstance(node, ast.Constant) and node.value is Ellipsis:
            raise ValueError("... is not allowed in an answer")
    return builtins.eval(compile(tree, "<answer>", "eval"), {"__builtins__": {}}, {})


def _guard_sympy() -> None:
    parser = sys.modules.get("sympy.parsing.sympy_parser")
    original = getattr(parser, "stringify_expr", None)
    if original is None or getattr(original, "_areal_guarded", False):
        return

    def stringify_expr(s: str, local_dict: Any, global_dict: Any, transformations: Any) -> str:
        code: str = original(s, local_dict, global_dict, transformations)
        check_sympy_code(code, local_dict)
        return code

    stringify_expr._areal_guarded = True  # type: ignore[attr-defined]
    stringify_expr.__doc__ = original.__doc__
    setattr(parser, "stringify_expr", stringify_expr)  # noqa: B010


def _guard_eval(prefix: str) -> None:
    for name, module in list(sys.modules.items()):
        if module is not None and (name == prefix or name.startswith(prefix + ".")):
            _bind_literal_eval(module)


def _bind_literal_eval(module: Any) -> None:
    namespace = getattr(module, "__dict__", None)
    if isinstance(namespace, dict) and namespace.get("eval") is not literal_eval:
        namespace["eval"] = literal_eval


def harden() -> None:
    """Apply the guards to whatever is loaded (idempotent; grading processes only)."""
    _guard_sympy()
    _guard_eval("reasoning_gym")


# ---- guarded as soon as imported -----------------------------------------------------------

_SYMPY_PARSER = "sympy.parsing.sympy_parser"


def _guarded_name(name: str) -> bool:
    return name == _SYMPY_PARSER or name == "reasoning_gym" or name.startswith("reasoning_gym.")


class _GuardingLoader(importlib.abc.Loader):
    """Runs the real loader, then applies the guard to the module it has just run; anything
    else (``get_source``, ``get_resource_reader``, ...) is the real loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        if module.__name__ == _SYMPY_PARSER:
            _guard_sympy()
        else:
            _bind_literal_eval(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _GuardOnImport(importlib.abc.MetaPathFinder):
    """Hands out the specs of the guarded modules with a :class:`_GuardingLoader`, so that
    a module a grade imports itself (a test that runs ``import sympy`` and then ``sympify``
    of a value the solution returned) is guarded before anything can call it."""

    def find_spec(
        self, fullname: str, path: Any, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not _guarded_name(fullname):
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is None:
                continue
            loader = spec.loader
            if loader is not None and hasattr(loader, "exec_module"):
                spec.loader = _GuardingLoader(loader)
            return spec
        return None


def install() -> None:
    """Guard what is loaded now and, through an import hook, every guarded module imported
    later in this process and its forks (the grading zygote calls it first of all)."""
    if not any(isinstance(finder, _GuardOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _GuardOnImport())
    harden()
