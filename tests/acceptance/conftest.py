"""Fixtures of the acceptance tests: the ``agentlease`` console script run as a user runs it.

Every run is a subprocess in its own working directory, with ``AGENTLEASE_DATA_DIR`` in the test's
temporary directory and no ``AGENTLEASE_*`` variable inherited from the caller's environment.

PostgreSQL is the server named by ``AGENTLEASE_TEST_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``); when it cannot be reached, the test is skipped
with a reason starting "PostgreSQL unavailable".
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from .runner import Background, Cli, WriteFile

PG_ADMIN_URL = os.environ.get("AGENTLEASE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
"""The maintenance database used to create and drop the per-test databases."""

PG_CONNECT_TIMEOUT_S = 5.0
"""How long to wait for the PostgreSQL server before skipping. Default 5s."""


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """The console script, run in an empty working directory under ``tmp_path``."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    return Cli(cwd=cwd, data_dir=tmp_path / "data")


@pytest.fixture
def write_file(cli: Cli) -> WriteFile:
    """Write ``text`` to ``name`` in the working directory; returns the path."""

    def write(name: str, text: str) -> Path:
        path = cli.cwd / name
        path.write_text(text)
        return path

    return write


@pytest.fixture
def background(cli: Cli) -> Iterator[Callable[..., Background]]:
    """Start long-running commands; whatever still runs at the end of the test is killed."""
    started: list[Background] = []

    def start(*args: str, env: Mapping[str, str] | None = None, stdout: bool = False) -> Background:
        started.append(Background(cli, *args, env=env, stdout=stdout))
        return started[-1]

    yield start
    for command in started:
        command.stop(signal.SIGKILL)  # a no-op for a command the test stopped already


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _admin(statement: str) -> None:
    try:
        connection = await asyncpg.connect(_asyncpg_dsn(PG_ADMIN_URL), timeout=PG_CONNECT_TIMEOUT_S)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        pytest.skip(f"PostgreSQL unavailable at {make_url(PG_ADMIN_URL)!r}: {type(exc).__name__}: {exc}")
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@pytest.fixture
def pg_ledger_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database ``agentlease_acc_<hex>``, dropped afterwards."""
    with fresh_pg_database() as url:
        yield url


@contextmanager
def fresh_pg_database(prefix: str = "agentlease_acc") -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database ``<prefix>_<hex>``, dropped (WITH (FORCE)) on exit."""
    name = f"{prefix}_{uuid.uuid4().hex}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}" TEMPLATE template0'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def pg_module_database() -> Iterator[Callable[[str], str]]:
    """``new(role)``: the URL of a fresh PostgreSQL database ``agentlease_<role>_<hex>`` kept for the
    tests of one module (a ledger shared by runs told apart by their ids, a downstream's database),
    dropped after the module."""
    with ExitStack() as stack:
        yield lambda role: stack.enter_context(fresh_pg_database(f"agentlease_{role}"))
