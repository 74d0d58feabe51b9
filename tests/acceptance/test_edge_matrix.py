"""The crash-point matrix of the downstream's edge, short form (the whole matrix: ``python -m bench.effects --matrix``).

Each edge's worst faults, with every crash point, on PostgreSQL (ledger and downstreams) and a few on SQLite:
exactly one effect at the downstream, and a ledger that agrees with it (:mod:`tests.acceptance.edge_matrix`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.acceptance.edge_matrix import Cell, Outcome, cells, run_cells, table

# Workers paused past their lease, resumed, and their late acts checked: alone on the cores (tests/serial.py).
pytestmark = [pytest.mark.timeout(1200), pytest.mark.serial]

SHORT_FORM = {
    "postgresql": [
        ("mcp-stdio", "kill"),
        ("mcp-http", "pause"),
        ("http", "pause"),
        ("http", "restart"),
        ("sql", "kill"),
    ],
    "sqlite": [("mcp-http", "kill"), ("http", "drop")],
}
"""The groups (edge, fault) CI runs, per ledger dialect."""


def _cells(dialect: str) -> list[Cell]:
    return [cell for cell in cells(dialect) if (cell.edge, cell.fault) in SHORT_FORM[dialect]]


@pytest.fixture(scope="module")
def pg_results(
    temporal_address: str, pg_module_database: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> dict[Cell, Outcome | str]:
    work = tmp_path_factory.mktemp("edge-pg")
    return asyncio.run(run_cells(temporal_address, pg_module_database("ledger"), work, _cells("postgresql")))


@pytest.fixture(scope="module")
def sqlite_results(temporal_address: str, tmp_path_factory: pytest.TempPathFactory) -> dict[Cell, Outcome | str]:
    work = tmp_path_factory.mktemp("edge-sqlite")
    return asyncio.run(run_cells(temporal_address, f"sqlite:///{work / 'ledger.db'}", work, _cells("sqlite")))


def _check(results: dict[Cell, Outcome | str], cell: Cell) -> None:
    outcome = results[cell]
    assert not isinstance(outcome, str), outcome
    problems = outcome.problems()
    assert not problems, f"{cell.id}: {problems}\n{table({cell: outcome})}"


@pytest.mark.postgres
@pytest.mark.parametrize("cell", _cells("postgresql"), ids=lambda cell: cell.id)
def test_edge_matrix_on_postgres(pg_results: dict[Cell, Outcome | str], cell: Cell) -> None:
    _check(pg_results, cell)


@pytest.mark.parametrize("cell", _cells("sqlite"), ids=lambda cell: cell.id)
def test_edge_matrix_on_sqlite(sqlite_results: dict[Cell, Outcome | str], cell: Cell) -> None:
    _check(sqlite_results, cell)
