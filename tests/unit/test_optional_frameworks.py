"""The agent frameworks are optional extras: nothing outside their adapters imports them."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.unit.test_layering import ROOT, project_modules

FRAMEWORKS = ("pydantic_ai",)
"""Top-level packages of the frameworks' extras."""

ADAPTERS = ("workflows.integrations.", "examples.agents.", "agentlease.pydantic_ai")
"""Modules allowed to import them: the adapters, their facades, the example agents."""

NOT_IMPORTABLE = ("agentlease.migrations",)
"""Alembic's scripts, which run only inside Alembic."""


def test_the_core_worker_and_cli_import_no_agent_framework() -> None:
    modules = sorted(name for name in project_modules() if not name.startswith(ADAPTERS + NOT_IMPORTABLE))
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({FRAMEWORKS!r}))))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
