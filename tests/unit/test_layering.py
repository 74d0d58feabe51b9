"""The layering rule: no import cycles, no edge from a lower layer to a higher one (CONTRIBUTING.md).

The library is the one package ``agentlease``, its modules grouped in rooms (:data:`ROOMS`). The layers,
lowest first: the base (the package root: vocabulary, values, settings, errors), the infrastructure
(security, observability, the decision table), the Temporal runtime glue, the ledger, the downstream's edge
(fencing, idempotency), recovery, then ``agentlease.tools`` and ``agentlease.workflow`` (side by side;
neither imports the other), the framework adapters, the worker level (``agentlease.plugin``,
``agentlease.worker``) beside the demo's downstream systems (``agentlease.demo``), the demo's agents, the
command line and the web view.
The public faces (``agentlease``, the packages' ``__init__``) re-export; no library module imports one.

Above all of them sits this repository's application (``worker.py``, ``activities``, ``workflows``,
``reconciliation``): it is written against the public API only (no ``agentlease._*`` module), and
nothing in the library imports it. Every import counts, including imports inside functions and
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPLICATION = ("activities", "workflows", "reconciliation")
"""The application's packages (with ``worker.py``)."""

RANKS = {
    "base": 0,
    "infrastructure": 1,
    "runtime": 2,
    "ledger": 3,
    "edge": 4,
    "recovery": 5,
    "tools": 6,
    "workflow": 6,
    "adapters": 7,
    "demo": 8,
    "worker": 8,
    "agents": 9,
    "cli": 10,
    "application": 11,
}
SIDE_BY_SIDE = {frozenset({"tools", "workflow"}), frozenset({"demo", "worker"})}
"""Layers of one rank that must not import each other."""

FACADES = {
    "agentlease",
    "agentlease.tools",
    "agentlease.workflow",
    "agentlease.recovery",
    "agentlease.openai_agents",
    "agentlease.pydantic_ai",
    "agentlease.langgraph",
    "agentlease.google_adk",
    "agentlease.strands",
    "agentlease.mcp",
}
"""The public faces: they re-export; no library module imports them (the application does)."""

FACES = FACADES | {
    "agentlease.lease",
    "agentlease.worker",
    "agentlease.tools.builtin",
    "agentlease.idempotency",
    "agentlease.errors",
}
"""What the application may import of the library: the faces, the worker's entry points, the built-in tools,
the downstream's guards and the errors."""
BUILTIN_TOOLS = "agentlease.tools.builtin."
"""The built-in tools' modules share their names with the tools the face exports."""

ROOMS = (
    # the most specific prefix first
    ("agentlease.decisions._activity", "tools"),
    ("agentlease.decisions", "infrastructure"),
    ("agentlease.demo.cli", "cli"),
    ("agentlease.demo.agents", "agents"),
    ("agentlease.demo", "demo"),
    ("agentlease.security", "infrastructure"),
    ("agentlease.observability", "infrastructure"),
    ("agentlease.runtime", "runtime"),
    ("agentlease.ledger", "ledger"),
    ("agentlease.migrations", "ledger"),
    ("agentlease.fencing", "edge"),
    ("agentlease.idempotency", "edge"),
    ("agentlease.recovery", "recovery"),
    ("agentlease.tools", "tools"),
    ("agentlease.lease", "tools"),
    ("agentlease.workflow", "workflow"),
    ("agentlease.adapters", "adapters"),
    ("agentlease.openai_agents", "adapters"),
    ("agentlease.pydantic_ai", "adapters"),
    ("agentlease.langgraph", "adapters"),
    ("agentlease.google_adk", "adapters"),
    ("agentlease.strands", "adapters"),
    ("agentlease.mcp", "adapters"),
    ("agentlease.plugin", "worker"),
    ("agentlease.worker", "worker"),
    ("agentlease.cli", "cli"),
    ("agentlease.ui", "cli"),
)
"""Each room of the package and its layer; the rest of the package root is the base (the vocabulary, values,
settings and errors every room uses)."""


def layer(module: str) -> str:
    if module == "worker" or module.split(".")[0] in APPLICATION:
        return "application"
    for prefix, name in ROOMS:
        if module == prefix or module.startswith(prefix + "."):
            return name
    return "base"


def project_modules() -> dict[str, Path]:
    modules = {"worker": ROOT / "worker.py"}
    for package in ("agentlease", *APPLICATION):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """Project modules ``path`` imports (the longest known prefix of each imported name)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # ``from pkg import mod`` imports pkg.mod; ``from pkg import name`` imports pkg.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for name in names:
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in known:
                    if candidate != module:
                        found.add(candidate)
                    break
    return found


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imports_of(path, name, known) for name, path in modules.items()}


def back_edges(edges: dict[str, set[str]]) -> list[str]:
    problems = []
    for source, targets in edges.items():
        for target in targets:
            if layer(source) == "application":
                if target.startswith("agentlease") and target not in FACES and not target.startswith(BUILTIN_TOOLS):
                    problems.append(f"{source} imports {target}, which is not a face; use the public API")
                continue
            if target in FACADES:
                if source not in FACADES:
                    problems.append(f"{source} imports the facade {target}; import the defining module")
                continue
            if source in FACADES:
                continue
            a, b = layer(source), layer(target)
            if RANKS[a] < RANKS[b] or frozenset({a, b}) in SIDE_BY_SIDE:
                problems.append(f"{source} ({a}) imports {target} ({b})")
    return sorted(problems)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_a_higher_layer_or_the_facade() -> None:
    assert back_edges(graph()) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(
    ("edges", "problem"),
    [
        (
            {"agentlease.ledger.store": {"agentlease.tools._declaration"}},
            "agentlease.ledger.store (ledger) imports agentlease.tools._declaration (tools)",
        ),
        (
            {"agentlease.tools._leased": {"agentlease.workflow._plan"}},
            "agentlease.tools._leased (tools) imports agentlease.workflow._plan (workflow)",
        ),
        (
            {"agentlease.recovery._sweeper": {"agentlease"}},
            "agentlease.recovery._sweeper imports the facade agentlease; import the defining module",
        ),
        ({"agentlease.plugin": {"agentlease.cli.app"}}, "agentlease.plugin (worker) imports agentlease.cli.app (cli)"),
        (
            {"agentlease.security.codec": {"agentlease.ledger.store"}},
            "agentlease.security.codec (infrastructure) imports agentlease.ledger.store (ledger)",
        ),
        (
            {"agentlease.ledger.store": {"agentlease.idempotency.store"}},
            "agentlease.ledger.store (ledger) imports agentlease.idempotency.store (edge)",
        ),
        ({"agentlease.cli.app": {"worker"}}, "agentlease.cli.app (cli) imports worker (application)"),
        (
            {"workflows.support": {"agentlease.workflow._calls"}},
            "workflows.support imports agentlease.workflow._calls, which is not a face; use the public API",
        ),
    ],
)
def test_the_rule_catches_a_back_edge(edges: dict[str, set[str]], problem: str) -> None:
    assert back_edges(edges) == [problem]


def test_the_rule_catches_a_cycle() -> None:
    edges = {
        "agentlease.tools._declaration": {"agentlease.tools.builtin"},
        "agentlease.tools.builtin": {"agentlease.tools._declaration"},
    }
    assert cycles(edges) == [["agentlease.tools._declaration", "agentlease.tools.builtin"]]


def test_the_graph_sees_function_level_imports() -> None:
    edges = graph()
    assert "agentlease.worker" in edges["agentlease.cli.app"]  # imported inside a command
    assert "agentlease.enums" in edges["agentlease.workflow._calls"]  # imported under imports_passed_through


def test_the_package_root_holds_at_most_15_modules() -> None:
    """The root is the base; every other subject has a room of its own (:data:`ROOMS`)."""
    root = sorted(path.stem for path in (ROOT / "agentlease").glob("*.py"))
    assert len(root) <= 15, root
    assert all(
        layer(f"agentlease.{name}") == "base" for name in root if name not in ("plugin", "worker", "lease", "fencing")
    )
