"""The layering rule: no import cycles, no edge from a lower layer to a higher one (CONTRIBUTING.md).

Layers, lowest first: the core (``agentlease.*``), ``reconciliation``, then ``activities`` and
``workflows`` (side by side; neither imports the other), ``worker`` (with ``agentlease.plugin``),
the CLI (``agentlease.cli``).
The facade ``agentlease/__init__.py`` sits above all of them and no project module imports it.
``examples`` are the demo's downstream systems: they may follow a built-in tool's contract (its
table shape, its slug rule) and sit beside ``worker``. ``examples.agents`` are example agents that
bring their own worker: they sit beside the CLI, which runs them in the demo. Every import counts,
including imports inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentlease", "reconciliation", "activities", "workflows", "examples")

RANKS = {
    "core": 0,
    "reconciliation": 1,
    "activities": 2,
    "workflows": 2,
    "examples": 3,
    "worker": 3,
    "cli": 4,
    "agents": 4,
}
SIDE_BY_SIDE = {frozenset({"activities", "workflows"}), frozenset({"examples", "worker"})}
"""Layers of one rank that must not import each other."""

FACADES = {"agentlease", "agentlease.workflow", "agentlease.openai_agents", "agentlease.pydantic_ai"}
"""Modules above every layer: they re-export; nothing of the project imports them."""

WORKER_LEVEL = {"agentlease.plugin"}
"""Modules of the ``agentlease`` package that sit at the worker's level: they register activities
and workflows on a worker."""


def layer(module: str) -> str:
    top = module.split(".")[0]
    if module in WORKER_LEVEL:
        return "worker"
    if module == "agentlease.cli" or module.startswith("agentlease.cli."):
        return "cli"
    if module == "examples.agents" or module.startswith("examples.agents."):
        return "agents"
    if top == "agentlease":
        return "core"
    return top


def project_modules() -> dict[str, Path]:
    modules = {"worker": ROOT / "worker.py"}
    for package in PACKAGES:
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
            {"agentlease.ledger.store": {"activities.tool"}},
            "agentlease.ledger.store (core) imports activities.tool (activities)",
        ),
        (
            {"activities.leased": {"workflows.agent_run"}},
            "activities.leased (activities) imports workflows.agent_run (workflows)",
        ),
        (
            {"reconciliation.sweeper": {"agentlease"}},
            "reconciliation.sweeper imports the facade agentlease; import the defining module",
        ),
        ({"worker": {"agentlease.cli.app"}}, "worker (worker) imports agentlease.cli.app (cli)"),
    ],
)
def test_the_rule_catches_a_back_edge(edges: dict[str, set[str]], problem: str) -> None:
    assert back_edges(edges) == [problem]


def test_the_rule_catches_a_cycle() -> None:
    assert cycles({"activities.tool": {"activities.builtin"}, "activities.builtin": {"activities.tool"}}) == [
        ["activities.builtin", "activities.tool"]
    ]


def test_the_graph_sees_function_level_imports() -> None:
    edges = graph()
    assert "worker" in edges["agentlease.cli.app"]  # imported inside a command
    assert "agentlease.enums" in edges["workflows.leased_calls"]  # imported under imports_passed_through
