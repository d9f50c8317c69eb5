"""Print the import graph of ``areal_agents``: package to package, circles, and layer breaches.

    python scripts/import_graph.py            # the package graph, bottom layer first
    python scripts/import_graph.py --modules  # every module-to-module import
    python scripts/import_graph.py --check    # exit 1 on a circle or an import against LAYERS

Every ``import areal_agents...`` counts: at module level, inside functions, and under
``TYPE_CHECKING``. Only the standard library is used; nothing of the package is imported.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "areal_agents"

#: The layers, bottom first: a part may import its own layer's parts below it in this list,
#: and lower layers; never a higher one. ``areal_agents`` itself is its ``__init__``.
LAYERS: list[list[str]] = [
    ["errors", "types", "net", "cpus", "stats"],  # contracts (stats: intervals, no torch)
    ["files", "config_values", "config_errors", "config", "cli"],
    ["sandboxes"],
    ["policies"],  # OpenAI-compatible clients: contracts only below; rewards' LLM judge uses them
    ["tools", "rewards"],
    ["envs"],
    ["serving"],
    ["rollout", "eval_viewer", "eval_config", "eval_summary", "preflight"],
    ["eval", "sandbox", "areal_agents"],
    ["trainers"],
    ["simulation"],
    ["train", "simulate"],
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``path`` imports (``from a.b import c`` is ``a.b.c`` when
    that is a module, else ``a.b``)."""

    def resolve(name: str) -> str:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found = [resolve(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found = [resolve(f"{node.module}.{alias.name}") for alias in node.names]
        else:
            continue
        out.update(name for name in found if name.startswith("areal_agents"))
    return out


def part(module: str) -> str:
    """``areal_agents.trainers.loop`` -> ``trainers``; the package itself -> ``areal_agents``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "areal_agents"


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges = {m: imports(p, known) - {m} for m, p in found.items()}
    # importing a.b.c runs a/__init__ and a/b/__init__ first: not an edge we draw
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def rank(name: str) -> tuple[int, int]:
    for level, layer in enumerate(LAYERS):
        if name in layer:
            return level, layer.index(name)
    raise KeyError(f"{name} is on no layer: add it to LAYERS in scripts/import_graph.py")


def breaches(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a part to a part above it (same-layer parts: left may not import right)."""
    out = []
    for source, targets in edges.items():
        for target in targets:
            a, b = part(source), part(target)
            if a != b and rank(b) > rank(a):
                out.append((source, target))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", action="store_true", help="module-level edges")
    parser.add_argument("--check", action="store_true", help="exit 1 on a circle or breach")
    args = parser.parse_args(argv)
    edges = graph()
    if args.modules:
        for source in sorted(edges):
            for target in sorted(edges[source]):
                print(f"{source} -> {target}")
    else:
        parts: dict[str, set[str]] = defaultdict(set)
        for source, targets in edges.items():
            parts[part(source)].update(part(t) for t in targets if part(t) != part(source))
        for name in sorted(parts, key=rank):
            print(f"{name:13} -> {', '.join(sorted(parts[name], key=rank)) or '(nothing)'}")
    found = circles(edges)
    bad = breaches(edges)
    for comp in found:
        print(f"circle: {' <-> '.join(sorted(comp))}")
    for source, target in bad:
        print(f"upward import: {source} -> {target}")
    if not found and not bad:
        print("no circles, no upward imports")
    return 1 if args.check and (found or bad) else 0


if __name__ == "__main__":
    raise SystemExit(main())
