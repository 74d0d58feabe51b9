"""The worker role on real PostgreSQL: every lease operation the product runs passes the row guards of
migration 0006 and the per-column grants of ``agentlease db grant``; each write no lease operation
makes is refused (issue 21, finding 6).

Each forbidden write is sent as the worker role itself (a leaked worker password), straight to the
database. Before the guards (schema 0004, ``GRANT UPDATE ON tasks``) every one of them succeeded.
"""

from __future__ import annotations

import importlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentlease.decisions._activity import apply, authenticate
from agentlease.decisions.table import DECISIONS, LedgerDecision, verify_recorded
from agentlease.enums import DecisionKind, ErrorClass, EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.expiry import SWEEPER_STATUSES, expired_leases, record_expiry
from agentlease.ledger.grants import LedgerRoles, grant_statements
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.refusals import record_refusal
from agentlease.ledger.store import Ledger
from agentlease.records import SettlementReceipt, TaskSpec
from agentlease.security.decision_auth import (
    DecisionVerifier,
    OperatorKey,
    SignedDecision,
    load_public_keys,
    new_operator_keys,
)

pytestmark = pytest.mark.postgres

guards = importlib.import_module("agentlease.migrations.versions.0006_ledger_guards")


def _as(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _spec(step: str, *, run: str = "run-1", key: str | None = None, tool: str = "send_mail") -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{step}",
        agent_run_id=run,
        step_id=step,
        tool=tool,
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=key or f"{run}:{step}",
        lease_ttl=timedelta(minutes=1),
        arguments_sha256="a" * 64,
    )


def _receipt(external_id: str) -> SettlementReceipt:
    return SettlementReceipt(
        external_system="mail", external_id=external_id, status="sent", verified_at=datetime.now(UTC)
    )


@dataclass
class Roles:
    """The ledger as its owner (``admin``) and as the worker role (``worker``), on one database."""

    url: str
    role: str
    admin: Ledger
    worker: Ledger

    async def refused(self, statement: str, *args: object) -> str:
        """Run ``statement`` as the worker role; it must be refused. Returns the refusal's message."""
        conn = await asyncpg.connect(_dsn(_as(self.url, self.role)))
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError) as refused:
                await conn.execute(statement, *args)
            return str(refused.value)
        finally:
            await conn.close()

    async def run(self, statement: str, *args: object) -> str:
        """Run ``statement`` as the worker role (it must pass)."""
        conn = await asyncpg.connect(_dsn(_as(self.url, self.role)))
        try:
            result: str = await conn.execute(statement, *args)
            return result
        finally:
            await conn.close()

    async def row(self, task_id: str) -> asyncpg.Record:
        conn = await asyncpg.connect(_dsn(self.url))
        try:
            return await conn.fetchrow("SELECT * FROM tasks WHERE task_id = $1", task_id)
        finally:
            await conn.close()


@pytest.fixture
async def roles(pg_url: str) -> AsyncIterator[Roles]:
    """A migrated ledger, a worker login role with exactly ``agentlease db grant``'s privileges."""
    role = f"agentlease_worker_{uuid.uuid4().hex[:8]}"
    admin_conn = await asyncpg.connect(_dsn(pg_url))
    await admin_conn.execute(f'CREATE ROLE "{role}" LOGIN')
    admin = Ledger.from_url(pg_url)
    worker: Ledger | None = None
    try:
        await upgrade(admin.database)
        for statement in grant_statements(LedgerRoles(worker=role)):
            await admin_conn.execute(statement)
        worker = Ledger.from_url(_as(pg_url, role))
        yield Roles(pg_url, role, admin, worker)
    finally:
        if worker is not None:
            await worker.close()
        await admin.close()
        await admin_conn.execute(f'DROP OWNED BY "{role}"')
        await admin_conn.execute(f'DROP ROLE "{role}"')
        await admin_conn.close()


async def test_every_lease_operation_of_the_product_passes_the_guards(roles: Roles, tmp_path: Path) -> None:
    worker, admin = roles.worker, roles.admin
    # claim, renew with stages, settle
    claim = await worker.claim(_spec("send"), "worker-a")
    await worker.renew(claim, reason="sending", stage=Stage.EXTERNAL_CALL)
    await worker.renew(claim, reason="back at an earlier stage keeps the furthest", stage=Stage.PREFLIGHT)
    await worker.settle(claim, _receipt("m1"))
    # a shared key: the second task settles from the receipt that stands (ON CONFLICT DO UPDATE)
    first = await worker.claim(_spec("a", key="shared:k"), "worker-a")
    await worker.settle(first, _receipt("shared-1"))
    second = await worker.claim(_spec("b", key="shared:k"), "worker-a")
    assert second.receipt is not None
    await worker.settle(second, second.receipt.receipt)
    # release and claim again; the claim of a lapsed lease (takeover); the sweeper's expiry
    retry = await worker.claim(_spec("retry"), "worker-a")
    await worker.release(retry, error_class=ErrorClass.RETRYABLE, error="503")
    again = await worker.claim(_spec("retry"), "worker-b")
    conn = await asyncpg.connect(_dsn(roles.url))  # the owner backdates the lease: it lapsed an hour ago
    await conn.execute(
        "UPDATE tasks SET lease_expires_at_ms = lease_expires_at_ms - 3600000 WHERE task_id = 'run-1/retry'"
    )
    taken = await worker.claim(_spec("retry"), "worker-c")
    assert taken.generation == again.generation + 1
    await conn.execute(
        "UPDATE tasks SET lease_expires_at_ms = lease_expires_at_ms - 3600000 WHERE task_id = 'run-1/retry'"
    )
    await conn.close()
    [lapsed] = await expired_leases(worker, limit=10)
    assert await record_expiry(
        worker, lapsed, status=TaskStatus.NEEDS_RECONCILIATION, decision="unsafe, past external_call"
    )
    assert TaskStatus.NEEDS_RECONCILIATION in SWEEPER_STATUSES
    # parks, and every decision of the table, applied as the decision activity does
    parked = await worker.claim(_spec("park"), "worker-a")
    await worker.dead_letter(parked, error_class=ErrorClass.PERMANENT, error="400")
    await worker.decide("run-1/park", DecisionKind.REDRIVE, by="alice", reason="fixed")
    await worker.decide("run-1/park", DecisionKind.CANCEL, by="alice", reason="not needed")
    await worker.decide("run-1/retry", DecisionKind.CONFIRM, by="alice", reason="seen", receipt=_receipt("r"))
    blocked = await worker.claim(_spec("creds"), "worker-a")
    await worker.await_decision(blocked, status=TaskStatus.BLOCKED, error_class=ErrorClass.CREDENTIAL, error="401")
    await worker.decide("run-1/creds", DecisionKind.REDRIVE, by="alice", reason="rotated")
    await worker.decide(
        "run-1/gate", DecisionKind.AWAIT_APPROVAL, by="run", reason="needs approval", spec=_spec("gate")
    )
    # an operator-signed approval: recorded with its proof, which the guard requires beside signed_by
    private, public = new_operator_keys("alice", tmp_path / "keys")
    request = {"step_id": "gate", "by": "alice", "reason": "ticket OPS-1"}
    proof = OperatorKey(private).sign("run-1", "approve", request)
    signed = SignedDecision(command="approve", request={**request, "proof": proof.model_dump(mode="json")})
    decision = LedgerDecision(
        kind=DecisionKind.APPROVE, task=_spec("gate"), by="alice", reason="ticket OPS-1", signed=signed
    )
    keys = load_public_keys(f"alice={public}")
    signed_by = authenticate(DecisionVerifier("authenticated", keys), decision)
    await apply(worker, decision, signed_by=signed_by)
    gate = await worker.claim(_spec("gate"), "worker-a")
    await worker.decide("run-1/gate", DecisionKind.CANCEL, by="alice", reason="late")
    assert gate.generation == 1
    # a refused call recorded on its own task
    await record_refusal(worker, _spec("refused", run="attacker"), "named another run's task")

    events = await worker.events("run-1/gate")
    [approved] = [e for e in events if e.kind is EventKind.APPROVED]
    assert approved.details is not None and approved.details["signed_by"] == "alice"
    assert verify_recorded("run-1", approved.details, keys, step_id="gate", kind=EventKind.APPROVED)
    assert {e.authenticated_as for e in await admin.events()} == {roles.role}
    statuses = {t.task_id: t.status for t in await admin.list_tasks()}
    assert statuses["run-1/send"] is TaskStatus.SETTLED and statuses["attacker/refused"] is TaskStatus.DEAD_LETTERED


async def _settled(roles: Roles) -> str:
    claim = await roles.worker.claim(_spec("send"), "worker-a")
    await roles.worker.settle(claim, _receipt("m1"))
    return claim.task_id


async def test_the_worker_role_cannot_lower_a_generation(roles: Roles) -> None:
    claim = await roles.worker.claim(_spec("send"), "worker-a")
    message = await roles.refused("UPDATE tasks SET claim_generation = 0 WHERE task_id = $1", claim.task_id)
    assert "only by a claim" in message
    assert (await roles.row(claim.task_id))["claim_generation"] == 1


async def test_the_worker_role_cannot_move_a_dead_lettered_task_to_settled(roles: Roles) -> None:
    claim = await roles.worker.claim(_spec("send"), "worker-a")
    await roles.worker.dead_letter(claim, error_class=ErrorClass.PERMANENT, error="400")
    message = await roles.refused(
        "UPDATE tasks SET status = 'settled', receipt = '{\"external_id\": \"forged\"}' WHERE task_id = $1",
        claim.task_id,
    )
    assert "moves dead_lettered to settled" in message
    assert (await roles.row(claim.task_id))["status"] == "dead_lettered"


async def test_the_worker_role_cannot_move_a_settled_task_anywhere(roles: Roles) -> None:
    task_id = await _settled(roles)
    await roles.refused("UPDATE tasks SET status = 'released' WHERE task_id = $1", task_id)
    assert (await roles.row(task_id))["status"] == "settled"


async def test_the_worker_role_cannot_rewrite_the_receipt_operators_see(roles: Roles) -> None:
    task_id = await _settled(roles)
    message = await roles.refused(
        'UPDATE tasks SET receipt = \'{"external_id": "forged"}\' WHERE task_id = $1', task_id
    )
    assert "stands" in message
    await roles.refused('UPDATE receipts SET receipt = \'{"external_id": "forged"}\'')  # no privilege at all
    assert json.loads((await roles.row(task_id))["receipt"])["external_id"] == "m1"


async def test_the_worker_role_cannot_detach_a_receipt_from_its_key(roles: Roles) -> None:
    await _settled(roles)
    message = await roles.refused(
        "UPDATE receipts SET idempotency_key = 'run-2:send' WHERE idempotency_key = 'run-1:send'"
    )
    assert "stands" in message
    assert await roles.worker.receipt("run-1:send") is not None


async def test_the_worker_role_cannot_plant_a_receipt_under_another_tasks_key(roles: Roles) -> None:
    await roles.worker.decide(
        "victim/send", DecisionKind.AWAIT_APPROVAL, by="run", reason="gate", spec=_spec("send", run="victim")
    )
    message = await roles.refused(
        "INSERT INTO receipts (idempotency_key, task_id, claim_generation, receipt, created_at_ms, tool) "
        "VALUES ('victim:send', 'victim/send', 0, '{}', 0, 'http_get')"
    )
    assert "only for its own task" in message
    assert await roles.worker.receipt("victim:send") is None


async def test_the_worker_role_cannot_set_an_owner_and_token_hash(roles: Roles) -> None:
    claim = await roles.worker.claim(_spec("send"), "worker-a")
    message = await roles.refused(
        "UPDATE tasks SET lease_owner = 'attacker', lease_token_sha256 = $2 WHERE task_id = $1", claim.task_id, "0" * 64
    )
    assert "only with a new generation" in message
    await roles.refused("UPDATE tasks SET lease_owner = NULL WHERE task_id = $1", claim.task_id)
    await roles.refused(  # nor hold a lease for a year
        "UPDATE tasks SET lease_expires_at_ms = lease_expires_at_ms + 31536000000 WHERE task_id = $1", claim.task_id
    )
    assert (await roles.row(claim.task_id))["lease_owner"] == "worker-a"


async def test_the_worker_role_cannot_change_what_a_task_is(roles: Roles) -> None:
    claim = await roles.worker.claim(_spec("send"), "worker-a")
    for column, value in (("tool", "'http_get'"), ("idempotency_key", "'shared:x'"), ("agent_run_id", "'other'")):
        await roles.refused(f"UPDATE tasks SET {column} = {value} WHERE task_id = $1", claim.task_id)
    await roles.refused("UPDATE tasks SET lease_ttl_ms = 31536000000 WHERE task_id = $1", claim.task_id)


async def test_the_worker_role_cannot_claim_a_live_lease_or_skip_a_generation(roles: Roles) -> None:
    claim = await roles.worker.claim(_spec("send"), "worker-a")
    await roles.refused(
        "UPDATE tasks SET claim_generation = claim_generation + 1, lease_owner = 'b', lease_token_sha256 = 'x' "
        "WHERE task_id = $1",
        claim.task_id,
    )
    await roles.refused("UPDATE tasks SET claim_generation = 99 WHERE task_id = $1", claim.task_id)


async def test_the_worker_role_cannot_write_authenticated_as(roles: Roles) -> None:
    await roles.run(
        "INSERT INTO lease_events (task_id, kind, claim_generation, at_ms, authenticated_as) "
        "VALUES ('run-1/x', 'renewed', 1, 0, 'alice')"
    )
    [entry] = await roles.admin.events("run-1/x")
    assert entry.authenticated_as == roles.role


async def test_the_worker_role_cannot_write_signed_by_without_the_signed_decision(roles: Roles) -> None:
    message = await roles.refused(
        "INSERT INTO lease_events (task_id, kind, claim_generation, at_ms, details) "
        'VALUES (\'run-1/x\', \'approved\', 0, 0, \'{"by": "alice", "signed_by": "alice"}\')'
    )
    assert "signed_by" in message
    assert await roles.admin.events("run-1/x") == []


async def test_the_worker_role_cannot_lock_the_tables_exclusively(roles: Roles) -> None:
    for table in ("tasks", "receipts", "lease_events"):
        conn = await asyncpg.connect(_dsn(_as(roles.url, roles.role)))
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                async with conn.transaction():
                    await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        finally:
            await conn.close()


def test_the_guards_allow_exactly_the_products_status_changes() -> None:
    """The migration's list is frozen with it: a new transition of the product needs a new revision."""
    product: set[tuple[str, str]] = set()
    claimable = [s for s in TaskStatus if s.claimable]
    for status in [*claimable, TaskStatus.RUNNING]:
        product.add((status.value, TaskStatus.RUNNING.value))  # a claim (of a lapsed lease, for running)
    ends = {TaskStatus.SETTLED, TaskStatus.RELEASED, TaskStatus.DEAD_LETTERED}
    ends |= {s for s in TaskStatus if s.awaits_decision and s is not TaskStatus.AWAITING_APPROVAL} | SWEEPER_STATUSES
    product |= {(TaskStatus.RUNNING.value, s.value) for s in ends}
    product |= {(s.value, TaskStatus.DEAD_LETTERED.value) for s in claimable}  # a refused call's own task
    for rule in DECISIONS.values():
        for source in rule.applies_to:
            for target in filter(None, (rule.to, rule.to_if_effect_unknown)):
                product.add((source.value, target.value))
    product = {(a, b) for a, b in product if a != b or a == "running"}
    assert set(guards.TRANSITIONS) == product
    assert dict(guards.STAGE_ORDER) == {stage.value: stage.order for stage in Stage}
