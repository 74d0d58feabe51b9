"""Least-privilege PostgreSQL roles (``agentlease db grant``) and the authenticated role in the trail.

On the real server: the administrator creates three roles and applies ``agentlease db grant
--apply`` through the CLI; a worker connected as the worker role does every lease operation, and
the evidence trail records the role it authenticated as beside its configured name; the worker
role cannot DELETE, rewrite the trail, run DDL or move the schema version; the reader only reads.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentlease.enums import EventKind, SideEffectClass, Stage
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import SettlementReceipt, TaskSpec
from tests.acceptance.runner import Cli

pytestmark = pytest.mark.postgres


def _as(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
async def roles(pg_url: str) -> AsyncIterator[dict[str, str]]:
    """Three login roles of this test, dropped (with their privileges) afterwards."""
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"agentlease_{kind}_{suffix}" for kind in ("worker", "operator", "reader")}
    admin = await asyncpg.connect(_dsn(pg_url))
    try:
        for name in names.values():
            await admin.execute(f'CREATE ROLE "{name}" LOGIN')
        yield names
    finally:
        for name in names.values():
            await admin.execute(f'DROP OWNED BY "{name}"')
            await admin.execute(f'DROP ROLE "{name}"')
        await admin.close()


async def _refused(url: str, role: str, statement: str) -> None:
    conn = await asyncpg.connect(_dsn(_as(url, role)))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(statement)
    finally:
        await conn.close()


async def test_the_worker_role_does_lease_operations_and_nothing_else(
    pg_url: str, roles: dict[str, str], tmp_path: Path
) -> None:
    admin_ledger = Ledger.from_url(pg_url)
    await upgrade(admin_ledger.database)
    await admin_ledger.close()
    cli = Cli(tmp_path, tmp_path / "data")
    granted = cli(
        "db",
        "grant",
        "--worker-role",
        roles["worker"],
        "--operator-role",
        roles["operator"],
        "--reader-role",
        roles["reader"],
        "--apply",
        env={"AGENTLEASE_LEDGER_URL": pg_url},
    )
    assert granted.returncode == 0, granted

    worker = Ledger.from_url(_as(pg_url, roles["worker"]))
    try:
        spec = TaskSpec(
            task_id="run-1/send",
            agent_run_id="run-1",
            step_id="send",
            tool="send_mail",
            side_effect_class=SideEffectClass.IDEMPOTENT,
            idempotency_key="run-1:send",
            lease_ttl=timedelta(minutes=1),
        )
        claim = await worker.claim(spec, "worker-a (configured)")
        await worker.renew(claim, reason="sending", stage=Stage.EXTERNAL_CALL)
        receipt = SettlementReceipt(
            external_system="mail", external_id="m1", status="sent", verified_at=datetime.now(UTC)
        )
        await worker.settle(claim, receipt)
        second = await worker.claim(spec.model_copy(update={"task_id": "run-1/next", "step_id": "next"}), "worker-a")
        await worker.release(second, error_class="retryable", error="503")
        events = await worker.events(spec.task_id)
    finally:
        await worker.close()
    assert [e.kind for e in events] == [EventKind.CLAIMED, EventKind.RENEWED, EventKind.SETTLED]
    assert {(e.lease_owner, e.authenticated_as) for e in events} == {("worker-a (configured)", roles["worker"])}

    for statement in (
        "DELETE FROM tasks",
        "DELETE FROM lease_events",
        "UPDATE lease_events SET reason = 'rewritten'",
        "UPDATE receipts SET receipt = '{}'",
        "UPDATE alembic_version SET version_num = '0001'",
        "CREATE TABLE intruder (id int)",
        "DROP TABLE receipts",
    ):
        await _refused(pg_url, roles["worker"], statement)
    for statement in ("UPDATE tasks SET status = 'settled'", "INSERT INTO lease_events (task_id) VALUES ('x')"):
        await _refused(pg_url, roles["reader"], statement)
    await _refused(pg_url, roles["operator"], "DELETE FROM tasks")

    reader = Ledger.from_url(_as(pg_url, roles["reader"]))
    try:
        assert {t.task_id for t in await reader.list_tasks()} == {"run-1/send", "run-1/next"}
    finally:
        await reader.close()


def test_grant_without_a_role_or_with_a_bad_name_is_a_one_line_error(tmp_path: Path) -> None:
    cli = Cli(tmp_path, tmp_path / "data")
    for args in (("db", "grant"), ("db", "grant", "--reader-role", "x" * 64)):
        result = cli(*args)
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result
    printed = cli("db", "grant", "--worker-role", "w")
    assert printed.returncode == 0 and 'GRANT INSERT ON "public".lease_events TO "w";' in printed.stdout
    assert "DELETE" not in printed.stdout
