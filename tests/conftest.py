"""Shared fixtures: a fresh ledger database per test, on SQLite and on PostgreSQL; one Temporal dev
server per test process; ``serial`` tests alone in a parallel run (:mod:`tests.serial`).

PostgreSQL is the server named by ``AGENTLEASE_TEST_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``). Each test gets its own database, dropped
afterwards; a ``ledger`` on PostgreSQL is a copy of a database migrated once per test process.
When the server cannot be reached the test is skipped with a reason starting "PostgreSQL
unavailable" (CI fails on any skipped postgres test).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.runtime.devserver import scratch_postgres_database
from tests.integration.temporal_server import DevServerThread
from tests.serial import Turnstile, lock_dir

collect_ignore = [] if importlib.util.find_spec("strands") else ["integration/test_strands.py"]
"""Strands' integration needs ``mcp<2``, the mcp extra ``mcp>=2``: its tests run in a virtualenv of their own
(``.ci/run``, which fails unless they ran there)."""

PG_ADMIN_URL = os.environ.get("AGENTLEASE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
"""The maintenance database used to create and drop the per-test databases."""

PG_CONNECT_TIMEOUT_S = 5.0
"""How long to wait for the PostgreSQL server before skipping. Default 5s."""


def _asyncpg_dsn(url: str) -> str:
    """asyncpg wants a plain ``postgresql://`` DSN, without a SQLAlchemy driver suffix."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _admin_connection() -> asyncpg.Connection:
    try:
        return await asyncpg.connect(_asyncpg_dsn(PG_ADMIN_URL), timeout=PG_CONNECT_TIMEOUT_S)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        pytest.skip(f"PostgreSQL unavailable at {make_url(PG_ADMIN_URL)!r}: {type(exc).__name__}: {exc}")


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped (WITH (FORCE)) after the test."""
    await (await _admin_connection()).close()  # skips, visibly, when the server cannot be reached
    async with scratch_postgres_database(PG_ADMIN_URL, "agentlease_test", timeout_s=PG_CONNECT_TIMEOUT_S) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a SQLite ledger file in the test's temporary directory."""
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest) -> str:
    """A fresh ledger database URL, once on SQLite and once on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


async def _admin(*statements: str) -> None:
    connection = await _admin_connection()
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


class MigratedTemplate:
    """A PostgreSQL database migrated on first use, then only copied (``CREATE DATABASE ... TEMPLATE``).

    A migration is one transaction of many statements with Python work between them; on a loaded
    machine that work can outlast the ledger's idle-in-transaction bound (5 s), which ends the session.
    Migrated once per test process, before the load, the ledgers of the tests are copies.
    """

    def __init__(self) -> None:
        self.name: str | None = None

    async def copy_to(self, url: str) -> None:
        """Replace the (empty) database of ``url`` by a copy of the migrated template."""
        if self.name is None:
            name = f"agentlease_template_{uuid.uuid4().hex}"
            await _admin(f'CREATE DATABASE "{name}" TEMPLATE template0')
            self.name = name
            template = Ledger.from_url(make_url(url).set(database=name).render_as_string(hide_password=False))
            try:
                await upgrade(template.database)
            finally:
                await template.close()  # a template must have no session when it is copied
        target = make_url(url).database
        await _admin(f'DROP DATABASE "{target}" WITH (FORCE)', f'CREATE DATABASE "{target}" TEMPLATE "{self.name}"')


@pytest.fixture(scope="session")
def pg_template() -> Iterator[MigratedTemplate]:
    """The migrated PostgreSQL template of this test process, dropped at its end."""
    template = MigratedTemplate()
    yield template
    if template.name is not None:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{template.name}" WITH (FORCE)'))


@pytest.fixture
async def ledger(ledger_url: str, pg_template: MigratedTemplate) -> AsyncIterator[Ledger]:
    """A migrated :class:`Ledger` on ``ledger_url`` (on PostgreSQL a copy of ``pg_template``); closed afterwards."""
    postgres = make_url(ledger_url).get_backend_name() == "postgresql"
    if postgres:
        await pg_template.copy_to(ledger_url)
    opened = Ledger.from_url(ledger_url)
    try:
        if not postgres:
            await upgrade(opened.database)
        yield opened
    finally:
        await opened.close()


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    """``host:port`` of a Temporal dev server shared by the tests of this process (one per xdist
    worker; never the time-skipping server)."""
    server = DevServerThread()
    try:
        yield server.start()
    finally:
        server.stop()


_TURNSTILE = pytest.StashKey["Turnstile | None"]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the turnstile its run shares
        config.stash[_TURNSTILE] = Turnstile.of_this_worker()
    elif config.pluginmanager.hasplugin("xdist") and config.getoption("testrunuid") is None:
        config.option.testrunuid = uuid.uuid4().hex  # known here, so that its lock files are removed


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist"):
        shutil.rmtree(lock_dir(config.getoption("testrunuid")), ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``serial`` tests last: with ``-n`` they then wait only for the last tests of the others."""
    items.sort(key=_serial)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Around setup, call and teardown (and before pytest-timeout starts counting): a ``serial`` test
    waits for the room to itself, and keeps it when the next test is ``serial`` too."""
    turnstile = item.config.stash.get(_TURNSTILE, None)
    if turnstile is None:
        return (yield)
    alone = _serial(item)
    turnstile.enter(alone=alone)
    try:
        return (yield)
    finally:
        if not (alone and nextitem is not None and _serial(nextitem)):
            turnstile.leave()


def _serial(item: pytest.Item) -> bool:
    return item.get_closest_marker("serial") is not None
