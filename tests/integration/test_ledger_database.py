"""Where ledger transactions run (:mod:`agentlease.ledger.database`), on real SQLite and PostgreSQL.

- a transaction commits when it returns and rolls back when it raises, on both databases;
- SQLite transactions run on the ledger's own thread, never on the event loop's;
- a SQLite read takes a snapshot without the write lock: it completes while another process's
  connection holds ``BEGIN IMMEDIATE``, and a write waits for that lock on the ledger thread
  while the event loop goes on;
- transactions queued behind another process's write lock wait one busy timeout in all, queue
  included, not one each;
- a disposed database opens its connections again on the next transaction;
- workers starting together on a fresh PostgreSQL database migrate it one after the other;
- on PostgreSQL, lease statements keep their pooled connection for the next one (one checkout for many
  cycles), give it back to a transaction or statement that waits for the pool (a pool of one serves
  both), and ping a kept connection idle past the threshold, replacing it when the server closed it;
- on PostgreSQL, a write blocked by a lock another session holds fails after the ledger's lock timeout as
  the ledger unavailable, and lands once the lock is gone; a server refusing a new session is the ledger
  unavailable too.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import asyncpg
import pytest
from sqlalchemy import event, make_url, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import LedgerUnavailableError
from agentlease.ledger.database import open_database
from agentlease.ledger.engine import create_async_database_engine
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import TASKS
from agentlease.records import SettlementReceipt, TaskSpec
from tests.conftest import MigratedTemplate, _asyncpg_dsn
from tests.eventually import assert_eventually


def _insert_probe(conn: Connection, task_id: str) -> None:
    conn.execute(
        TASKS.insert().values(
            task_id=task_id,
            agent_run_id="run",
            step_id=task_id,
            tool="probe",
            side_effect_class="read_only",
            status="pending",
            lease_ttl_ms=1000,
            claim_generation=0,
            attempts=0,
            renewal_count=0,
            idempotency_key=f"run:{task_id}",
            created_at_ms=0,
            updated_at_ms=0,
        )
    )


def _queued_probe(conn: Connection, *, i: int) -> None:
    _insert_probe(conn, f"queued-{i}")


def _task_ids(conn: Connection) -> list[str]:
    return list(conn.execute(select(TASKS.c.task_id).order_by(TASKS.c.task_id)).scalars())


async def test_commit_on_return_rollback_on_raise(ledger: Ledger) -> None:
    db = ledger.database
    await db.write(lambda conn: _insert_probe(conn, "kept"))

    def insert_then_fail(conn: Connection) -> None:
        _insert_probe(conn, "rolled-back")
        raise LookupError("the transaction fails after its write")

    with pytest.raises(LookupError, match="fails after its write"):
        await db.write(insert_then_fail)
    assert await db.read(_task_ids) == ["kept"]


async def test_sqlite_transactions_run_on_the_ledger_thread(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    try:
        names = {await db.read(lambda _conn: threading.current_thread().name) for _ in range(5)}
        names.add(await db.write(lambda _conn: threading.current_thread().name))
    finally:
        await db.dispose()
    assert len(names) == 1
    [name] = names
    assert name.startswith("agentlease-ledger") and name != threading.current_thread().name


@pytest.fixture
async def sqlite_ledger(sqlite_url: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(sqlite_url)
    try:
        await upgrade(ledger.database)
        await ledger.database.write(lambda conn: _insert_probe(conn, "committed"))
        yield ledger
    finally:
        await ledger.close()


@contextmanager
def other_writer(sqlite_url: str) -> Iterator[sqlite3.Connection]:
    """Another process's writer, as far as SQLite can tell: its own connection, holding the write
    lock with an uncommitted change to the task ``committed``; rolled back unless committed."""
    other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE tasks SET tool = 'other' WHERE task_id = 'committed'")
        yield other
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()


async def test_sqlite_write_waits_for_another_writer_off_the_event_loop(sqlite_ledger: Ledger, sqlite_url: str) -> None:
    with other_writer(sqlite_url) as other:
        write = asyncio.ensure_future(sqlite_ledger.database.write(lambda conn: _insert_probe(conn, "after")))
        ticks = 0

        async def loop_runs() -> None:
            nonlocal ticks
            ticks += 1
            assert ticks >= 3

        # The write waits in SQLite's busy handler on the ledger thread; the loop is free.
        await assert_eventually(loop_runs, timeout=10, message="event loop keeps running")
        assert not write.done()
        other.execute("COMMIT")
    await asyncio.wait_for(write, timeout=30)
    assert await sqlite_ledger.database.read(_task_ids) == ["after", "committed"]
    assert (await sqlite_ledger.get_task("committed")).tool == "other"


async def test_sqlite_read_runs_while_another_writer_holds_the_lock(sqlite_ledger: Ledger, sqlite_url: str) -> None:
    with other_writer(sqlite_url):
        # The read is a snapshot (plain BEGIN): it completes and does not see the uncommitted change.
        record = await asyncio.wait_for(sqlite_ledger.get_task("committed"), timeout=30)
        assert record.tool == "probe"


async def test_queued_sqlite_writes_share_one_busy_timeout(sqlite_ledger: Ledger, sqlite_url: str) -> None:
    db = open_database(sqlite_url, sqlite_busy_timeout_ms=300)
    try:
        with other_writer(sqlite_url):
            outcomes = await asyncio.gather(
                *(db.write(functools.partial(_queued_probe, i=i)) for i in range(4)),
                return_exceptions=True,
            )
    finally:
        await db.dispose()
    # A write that could not get the lock in time is a ledger outage, with SQLite's own error as its cause.
    assert all(isinstance(outcome, LedgerUnavailableError) for outcome in outcomes), outcomes
    causes = [outcome.__cause__ for outcome in outcomes if isinstance(outcome, BaseException)]
    assert all(isinstance(cause, OperationalError) for cause in causes), causes
    messages = [str(cause.orig) for cause in causes if isinstance(cause, OperationalError)]
    # The first waits in SQLite's busy handler; a write that reaches the thread after its deadline
    # fails at once instead of waiting the busy timeout again (at the latest the third one).
    assert messages[0] == "database is locked"
    assert any("behind this process's other ledger transactions" in message for message in messages[1:3]), messages
    assert await sqlite_ledger.database.read(_task_ids) == ["committed"]


async def test_workers_starting_together_migrate_a_fresh_postgresql_ledger_once(pg_url: str) -> None:
    ledgers = [Ledger.from_url(pg_url) for _ in range(4)]
    try:
        await asyncio.gather(*(upgrade(ledger.database) for ledger in ledgers))
        assert await ledgers[0].database.read(_task_ids) == []
    finally:
        for ledger in ledgers:
            await ledger.close()


async def test_libpq_options_of_a_postgresql_url_reach_the_session(pg_url: str) -> None:
    """``application_name`` is set on the ledger's sessions beside the ledger's own bound on an idle transaction,
    and on a downstream engine's; ``sslmode=disable`` and ``connect_timeout`` connect as they say."""
    url = f"{pg_url}?sslmode=disable&connect_timeout=5&application_name=agentlease-test"
    ledger = Ledger.from_url(url)
    try:
        shown = await ledger.database.read(
            lambda conn: conn.exec_driver_sql(
                "SELECT current_setting('application_name'), current_setting('idle_in_transaction_session_timeout')"
            ).one()
        )
    finally:
        await ledger.close()
    assert tuple(shown) == ("agentlease-test", "5s")
    engine = create_async_database_engine(url)
    try:
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("SHOW application_name")).scalar_one() == "agentlease-test"
    finally:
        await engine.dispose()


async def test_disposed_database_opens_again(ledger: Ledger) -> None:
    await ledger.database.write(lambda conn: _insert_probe(conn, "one"))
    await ledger.close()
    await ledger.close()  # twice is harmless
    assert await ledger.database.read(_task_ids) == ["one"]


@pytest.fixture
async def pg_ledger_of_one(pg_url: str, pg_template: MigratedTemplate) -> AsyncIterator[Ledger]:
    """A migrated PostgreSQL ledger whose pool holds ONE connection."""
    await pg_template.copy_to(pg_url)
    ledger = Ledger.from_url(pg_url, pool_size=1)
    try:
        yield ledger
    finally:
        await ledger.close()


def _spec(step: str) -> TaskSpec:
    """A task ``run/<step>`` of an idempotent tool, leased for 30 s."""
    return TaskSpec(
        task_id=f"run/{step}",
        agent_run_id="run",
        step_id=step,
        tool="probe",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=f"run:{step}",
        lease_ttl=timedelta(seconds=30),
    )


async def _cycle(ledger: Ledger, step: str) -> None:
    """Claim a new task, renew it into ``external_call``, settle it: three one-statement lease writes."""
    claim = await ledger.claim(_spec(step), "worker")
    await ledger.renew(claim, reason="calling the external system", stage=Stage.EXTERNAL_CALL)
    receipt = SettlementReceipt(external_system="x", external_id=step, status="done", verified_at=datetime.now(UTC))
    await ledger.settle(claim, receipt)


async def test_postgresql_lease_statements_keep_their_connection(pg_ledger_of_one: Ledger) -> None:
    checkouts: list[int] = []
    engine = pg_ledger_of_one.database._engine.sync_engine  # type: ignore[attr-defined]
    event.listen(engine.pool, "checkout", lambda *_args: checkouts.append(1))
    for step in ("a", "b", "c"):
        await _cycle(pg_ledger_of_one, step)
    assert len(checkouts) == 1  # nine lease statements, one pool checkout
    assert await pg_ledger_of_one.database.read(_task_ids) == ["run/a", "run/b", "run/c"]  # a transaction too


async def test_postgresql_pool_of_one_serves_statements_and_transactions_together(pg_ledger_of_one: Ledger) -> None:
    """Callers waiting for the pool get the connection a lease statement kept (nobody waits for the pool timeout)."""
    steps = [f"s{i}" for i in range(6)]
    reads = [pg_ledger_of_one.database.read(_task_ids) for _ in range(6)]
    await asyncio.gather(*(_cycle(pg_ledger_of_one, step) for step in steps), *reads)
    assert await pg_ledger_of_one.database.read(_task_ids) == sorted(f"run/{step}" for step in steps)


async def test_postgresql_kept_connection_closed_by_the_server_is_replaced(
    pg_ledger_of_one: Ledger, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentlease.ledger.database as database
    import agentlease.ledger.engine as engine

    for module in (database, engine):  # every connection, kept or pooled, counts as idle: pinged before use
        monkeypatch.setattr(module, "PG_PING_AFTER_IDLE_S", 0.0)
    await _cycle(pg_ledger_of_one, "before")
    assert await _end_sessions(pg_url) == 1  # the server ends the kept connection's session (a restart...)
    await _cycle(pg_ledger_of_one, "after")  # not LedgerUnavailableError: the ping found it gone
    assert await pg_ledger_of_one.database.read(_task_ids) == ["run/after", "run/before"]


async def test_postgresql_kept_connection_given_back_is_pinged_as_idle_since_it_was_kept(
    pg_ledger_of_one: Ledger, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentlease.ledger.database as database

    hour_ago = SimpleNamespace(monotonic=lambda: time.monotonic() - 3600)
    monkeypatch.setattr(database, "time", hour_ago)  # the lease statements keep their connection an hour ago
    await _cycle(pg_ledger_of_one, "before")
    assert await _end_sessions(pg_url) == 1
    # The transaction takes the kept connection back through the pool, which pings it (idle for an hour).
    assert await pg_ledger_of_one.database.read(_task_ids) == ["run/before"]


async def test_postgresql_write_blocked_by_a_lock_held_elsewhere_fails_as_unavailable_and_lands_after(
    pg_url: str, pg_template: MigratedTemplate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's open ``SELECT ... FOR UPDATE`` on a task does not hold its renewal without bound: after the
    ledger's lock timeout the renewal fails as the ledger unavailable; once the lock is gone it lands."""
    import agentlease.ledger.engine as engine

    monkeypatch.setattr(engine, "PG_LOCK_TIMEOUT_MS", 300)  # read when the ledger's engine is made
    await pg_template.copy_to(pg_url)
    ledger = Ledger.from_url(pg_url)
    operator = await asyncpg.connect(_asyncpg_dsn(pg_url))
    try:
        spec = _spec("locked")
        claim = await ledger.claim(spec, "worker")
        locked = operator.transaction()
        await locked.start()
        await operator.execute("SELECT 1 FROM tasks WHERE task_id = $1 FOR UPDATE", spec.task_id)
        with pytest.raises(LedgerUnavailableError, match="lock timeout"):
            await ledger.renew(claim, reason="calling the external system", stage=Stage.EXTERNAL_CALL)
        await locked.rollback()
        await ledger.renew(claim, reason="calling the external system", stage=Stage.EXTERNAL_CALL)
        assert (await ledger.get_task(spec.task_id)).renewal_count == 1
    finally:
        await operator.close()
        await ledger.close()


async def test_postgresql_server_refusing_a_new_session_is_the_ledger_unavailable(
    pg_url: str, pg_template: MigratedTemplate
) -> None:
    """A server that answers a new session with an error (here a role's connection limit; "not yet accepting
    connections" while it starts up) fails a lease statement as the ledger unavailable, in one line, as a
    refused connection does: the write is retried or deferred, never a traceback that ends the attempt."""
    await pg_template.copy_to(pg_url)
    role = f"agentlease_limited_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(_asyncpg_dsn(pg_url))
    holder = Ledger.from_url(pg_url)
    await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
    limited = Ledger.from_url(str(make_url(pg_url).set(username=role)))
    try:
        spec = _spec("limited")
        claim = await holder.claim(spec, "worker")
        with pytest.raises(LedgerUnavailableError, match="too many connections"):
            await limited.renew(claim, reason="calling the external system", stage=Stage.EXTERNAL_CALL)
    finally:
        await limited.close()
        await holder.close()
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()


async def _end_sessions(pg_url: str) -> int:
    """End every other session on the database of ``pg_url`` (as a restart would); how many."""
    admin = await asyncpg.connect(_asyncpg_dsn(pg_url))
    try:
        ended: int = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await admin.close()
    return ended
