"""The agent frameworks are optional extras: nothing outside their adapters imports them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.test_layering import ROOT, project_modules

FRAMEWORKS = ("pydantic_ai", "langgraph", "langchain_core", "google.adk", "google.genai")
"""Packages of the frameworks' extras."""

ADAPTERS = (
    "agentlease.openai_agents",
    "agentlease.demo.agents.",
    "agentlease.pydantic_ai",
    "agentlease.langgraph",
    "agentlease.google_adk",
    "agentlease.strands",
)
"""Modules allowed to import them: the adapters, their facades, the example agents."""

NOT_IMPORTABLE = ("agentlease.migrations",)
"""Alembic's scripts, which run only inside Alembic."""


def test_the_core_worker_and_cli_import_no_agent_framework() -> None:
    modules = sorted(name for name in project_modules() if not name.startswith(ADAPTERS + NOT_IMPORTABLE))
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"found = {{f for f in {FRAMEWORKS!r} for m in sys.modules if (m + '.').startswith(f + '.')}}\n"
        "print(json.dumps(sorted(found)))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_the_demo_skips_an_agent_whose_framework_is_not_installed() -> None:
    """`pip install -e .` without the framework extras: the demo runs the plans and says what it skipped."""
    from agentlease.demo.cli import agents as demo_agents

    present, absent = (
        demo_agents.DemoAgent("here", lambda s: s, demo_agents._start_openai, module="json", extra="x"),
        demo_agents.DemoAgent("gone", lambda s: s, demo_agents._start_openai, module="no_such_framework", extra="y"),
    )
    assert present.installed and not absent.installed
    assert all(agent.installed for agent in demo_agents.AGENTS)  # this test venv has both extras
    assert demo_agents.missing_frameworks() == []


@pytest.mark.parametrize(
    ("face", "missing", "extra"),
    [
        ("agentlease.openai_agents", "agents", "openai-agents"),
        ("agentlease.pydantic_ai", "pydantic_ai", "pydantic-ai"),
        ("agentlease.langgraph", "langgraph", "langgraph"),
        ("agentlease.google_adk", "google.adk", "google-adk"),
        ("agentlease.strands", "strands", "strands"),
        ("agentlease.mcp", "mcp", "mcp"),
        ("agentlease.idempotency.middleware", "starlette", "middleware"),
    ],
)
def test_a_face_whose_extra_is_missing_says_which_in_one_line(face: str, missing: str, extra: str) -> None:
    script = f"import sys; sys.modules[{missing!r}] = None\nimport {face}"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and f"pip install 'agentlease[{extra}]'" in last, done.stderr


def test_the_facade_has_at_most_25_names() -> None:
    import agentlease

    assert len([name for name in agentlease.__all__ if name != "__version__"]) <= 25
