"""A command imports what it uses: ``agentlease --help`` and an idle ``agentlease sweep --once`` start
without the ledger's or Temporal's stack where they do not need it, so their start-up stays cheap.

Modules are counted, not timed: a count does not depend on the machine's load. Each command runs in a
fresh interpreter, as a user runs it; the budget is what the command imports today (``--help``: 508
modules with Python 3.11; an idle sweep on a SQLite ledger: 533) plus room for a dependency's next
release, well below what it imported when every command module loaded the ledger (631) or the sweep
loaded the built-in tools (1,026), or before the metrics' families were loaded on first use (546 and
690), or while a SQLite ledger's sweep loaded SQLAlchemy's ORM, asyncpg and cryptography (649).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger

_RUN = """
import contextlib, io, json, sys
from agentlease.cli.app import _run
with contextlib.redirect_stdout(io.StringIO()) as shown:
    code = _run(sys.argv[1:])
print(json.dumps({"code": code, "shown": shown.getvalue(), "modules": sorted(sys.modules)}))
"""

HELP_BUDGET = 560
"""Modules ``agentlease --help`` may import (508 in Python 3.11 with this project's locked dependencies)."""

SWEEP_BUDGET = 595
"""Modules an idle ``agentlease sweep --once`` on a SQLite ledger may import (533 today)."""


def _imported(where: Path, *argv: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """What the command printed and every module it imported, in a fresh interpreter working in ``where``."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN, *argv],
        cwd=where,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["code"] == 0, done.stderr
    return found["shown"], found["modules"]


def _packages(modules: list[str], *names: str) -> set[str]:
    return {module for module in modules if module.split(".")[0] in names or module.startswith(names)}


def test_help_imports_neither_the_ledger_nor_temporal(tmp_path: Path) -> None:
    shown, modules = _imported(tmp_path, "--help")
    assert "sweep" in shown and "AGENTLEASE_LEDGER_URL" in shown
    heavy = _packages(
        modules,
        "sqlalchemy",
        "asyncpg",
        "temporalio",
        "httpx",
        "cryptography",
        "agentlease.ledger",
        "prometheus_client",
        "alembic",
        "opentelemetry",
    )
    assert not heavy, f"--help imports {sorted(heavy)[:20]}"
    assert "agentlease.records" not in modules
    assert len(modules) <= HELP_BUDGET, f"--help imports {len(modules)} modules (budget {HELP_BUDGET})"


@pytest.mark.timeout(120)
async def test_an_idle_sweep_imports_no_tool_and_not_temporal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger.from_url(url)
    try:
        await upgrade(ledger.database)
    finally:
        await ledger.close()
    shown, modules = _imported(tmp_path, "sweep", "--once", env={"AGENTLEASE_LEDGER_URL": url})
    assert shown.startswith("examined 0:"), shown
    # Nothing recorded, nothing served: the metrics' families (prometheus_client) are not loaded either; the
    # ledger is opened, not migrated (no alembic), and not traced (no OpenTelemetry). A SQLite ledger needs
    # neither PostgreSQL's driver (asyncpg) nor SQLAlchemy's asyncio engine, its tables are Core tables (no
    # ORM), and no decision is signed or verified (no cryptography). SQLAlchemy's PostgreSQL dialect does
    # load: the ledger's statements are built with it (its upserts, the partial index's postgresql_where).
    heavy = _packages(
        modules,
        "temporalio",
        "httpx",
        "agentlease.tools",
        "agentlease.workflow",
        "prometheus_client",
        "alembic",
        "agentlease.ledger.migrate",
        "agentlease.migrations",
        "opentelemetry",
        "asyncpg",
        "sqlalchemy.ext.asyncio",
        "sqlalchemy.orm",
        "cryptography",
    )
    assert not heavy, f"an idle sweep imports {sorted(heavy)[:20]}"
    assert len(modules) <= SWEEP_BUDGET, f"sweep --once imports {len(modules)} modules (budget {SWEEP_BUDGET})"
