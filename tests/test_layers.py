"""The package's layering holds: no import circle, no import upward, light lower layers.

``scripts/import_graph.py`` (also a command: it prints the graph) does the reading.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import import_graph  # noqa: E402


def test_no_circles_and_no_upward_imports() -> None:
    edges = import_graph.graph()
    assert import_graph.circles(edges) == []
    assert import_graph.breaches(edges) == []
    assert import_graph.main(["--check"]) == 0


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    edges = {
        "areal_agents.types": {"areal_agents.trainers.loop"},
        "areal_agents.trainers.loop": set(),
    }
    assert import_graph.breaches(edges) == [("areal_agents.types", "areal_agents.trainers.loop")]
    edges = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}
    assert import_graph.circles(edges) == [{"a.x", "a.y", "a.z"}]


def _third_party(package: str) -> set[str]:
    found = set()
    for path in (ROOT / "areal_agents" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_environments_tools_sandboxes_and_clients_need_no_torch_ray_or_vllm() -> None:
    for package in ("envs", "tools", "sandboxes", "rewards", "policies"):
        assert _third_party(package).isdisjoint({"torch", "ray", "vllm"}), package
