"""A signed decision applies once: its decision id, inside the signature, is recorded unique in the
ledger, and the proof names the task's generation the operator saw.

On the real dev server, each ledger: the same signed redrive sent twice (the update copied from the
history needs no key) is applied once and the tool is not run again; the refusal is recorded once in
the trail however often it is sent; a decision signed for an older generation is refused; the CLI
sends the id and the generation it read. Beside them: a changed decision id or generation breaks the
signature, a Temporal retry of the activity that applied a decision still reports it applied while
another activity's use of the same id is a replay, the migration upgrades a 0006 ledger, and the
worker role on PostgreSQL may insert the decision ids but not change or delete them.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import text
from sqlalchemy.engine import make_url
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from agentlease.decisions.table import DecisionRequest, LedgerDecision, ReconcileRequest, verify_recorded
from agentlease.enums import DecisionKind, ErrorClass, EventKind, SideEffectClass, TaskStatus
from agentlease.errors import TaskMovedError
from agentlease.ledger.grants import LedgerRoles, grant_statements
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import ApprovalRequest, TaskSpec
from agentlease.security.decision_auth import (
    DecisionRefusedError,
    DecisionVerifier,
    OperatorKey,
    SignedDecision,
    load_public_keys,
    signed_message,
)
from agentlease.settings import AgentLeaseSettings
from tests.integration.test_decisions import running, wait_for
from tests.security.edge_cli import agentlease

pytestmark = pytest.mark.timeout(150)


def _operator(tmp_path: Path, key: Ed25519PrivateKey | None = None, name: str = "alice") -> tuple[OperatorKey, str]:
    """An operator's key file (as ``agentlease keys new-operator`` writes it; default Alice's) and the public key,
    base64."""
    key = key or Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path = tmp_path / f"{name}.key"
    path.write_bytes(f"agentlease-operator: {name}\n".encode() + pem)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return OperatorKey(path), base64.b64encode(raw).decode()


def _signed(key: OperatorKey, run: str, command: str, request: DecisionRequest, **sign: Any) -> dict[str, Any]:
    """The update payload of ``request`` signed by ``key`` (what the CLI sends)."""
    proof = key.sign(run, command, request.model_dump(mode="json"), **sign)
    return {**request.model_dump(mode="json"), "proof": proof.model_dump(mode="json")}


@asynccontextmanager
async def _authenticated(
    client: Client, settings: AgentLeaseSettings, ledger_url: str, public: str
) -> AsyncIterator[tuple[WorkflowHandle, Ledger, str]]:
    settings = settings.model_copy(
        update={"decision_mode": "authenticated", "operator_keys": f"alice={public}", "ledger_url": ledger_url}
    )
    async with running(client, settings, ("flaky", "always_retryable", {})) as started:
        try:
            yield started
        finally:  # the run still waits for a person: ended while its worker is up
            with suppress(RPCError):
                await started[0].terminate("test over")


async def _refused(handle: WorkflowHandle, update: str, payload: object, why: str) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await handle.execute_update(update, payload)
    cause = info.value.cause
    said = f"{cause} {getattr(cause, 'cause', '')}"
    assert why in said, said
    return said


def _claims(trail: list[Any]) -> int:
    return len([e for e in trail if e.kind is EventKind.CLAIMED])


async def test_the_same_signed_redrive_sent_twice_is_applied_once(
    client: Client, settings: AgentLeaseSettings, ledger_url: str, tmp_path: Path
) -> None:
    key, public = _operator(tmp_path)
    async with _authenticated(client, settings, ledger_url, public) as (handle, ledger, run):
        task_id = f"{run}/flaky"
        await wait_for(handle, "flaky", "dead_lettered")
        assert (await ledger.get_task(task_id)).claim_generation == 2
        redrive = _signed(key, run, "redrive", DecisionRequest(step_id="flaky", by="alice", reason="upstream fixed"))
        await handle.execute_update("redrive", redrive)
        status = await wait_for(handle, "flaky", "dead_lettered")  # two more real attempts, failed again
        assert status.tasks[0].claim_generation == 4
        before = await ledger.events(task_id)
        assert _claims(before) == 4

        # The update as it stands in the history, sent again and again: refused each time, not run again.
        for _ in range(3):
            await _refused(handle, "redrive", redrive, "replayed")
        record = await ledger.get_task(task_id)
        trail = await ledger.events(task_id)
        assert (record.status, record.claim_generation, _claims(trail)) == (TaskStatus.DEAD_LETTERED, 4, 4)
        assert len([e for e in trail if e.kind is EventKind.REDRIVEN]) == 1
        [replayed] = [e for e in trail if e.kind is EventKind.DECISION_REFUSED]  # once, however often sent
        assert (replayed.details or {}).get("decision_id") == redrive["proof"]["decision_id"]
        assert (replayed.details or {}).get("refused") == "replayed"
        assert (await handle.query("status"))["status"] == "waiting"


async def test_a_signed_decision_for_an_older_generation_is_refused(
    client: Client, settings: AgentLeaseSettings, ledger_url: str, tmp_path: Path
) -> None:
    key, public = _operator(tmp_path)
    async with _authenticated(client, settings, ledger_url, public) as (handle, ledger, run):
        task_id = f"{run}/flaky"
        await wait_for(handle, "flaky", "dead_lettered")
        # Signed while the task was at generation 2, held back, sent after it moved on.
        request = DecisionRequest(step_id="flaky", by="alice", reason="seen at generation 2")
        held = _signed(key, run, "redrive", request, generation=2)
        await handle.execute_update(
            "redrive", _signed(key, run, "redrive", request.model_copy(update={"reason": "now"}), generation=2)
        )
        await wait_for(handle, "flaky", "dead_lettered")
        assert (await ledger.get_task(task_id)).claim_generation == 4
        await _refused(handle, "redrive", held, "generation 2")
        record = await ledger.get_task(task_id)
        assert (record.status, record.claim_generation, _claims(await ledger.events(task_id))) == (
            TaskStatus.DEAD_LETTERED,
            4,
            4,
        )
        # Signed for the generation the ledger holds: applied.
        fresh = _signed(key, run, "redrive", request.model_copy(update={"reason": "at 4"}), generation=4)
        await handle.execute_update("redrive", fresh)
        await wait_for(handle, "flaky", "dead_lettered")
        assert (await ledger.get_task(task_id)).claim_generation == 6


async def test_the_cli_sends_a_decision_id_and_the_generation_it_read(
    client: Client, settings: AgentLeaseSettings, ledger_url: str, tmp_path: Path, temporal_address: str
) -> None:
    made = await agentlease("keys", "new-operator", "alice", "--dir", str(tmp_path / "keys"), env={})
    assert made.returncode == 0, made.stderr
    public = str(tmp_path / "keys" / "alice.pub")
    async with _authenticated(client, settings, ledger_url, public) as (handle, ledger, run):
        env = {
            "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address,
            "AGENTLEASE_TASK_QUEUE": settings.task_queue,
            "AGENTLEASE_LEDGER_URL": ledger_url,
            "AGENTLEASE_OPERATOR_KEY": str(tmp_path / "keys" / "alice.key"),
        }
        await wait_for(handle, "flaky", "dead_lettered")
        for expected in (2, 4):
            redriven = await agentlease("redrive", run, "flaky", "--reason", f"try {expected}", env=env)
            assert redriven.returncode == 0, redriven.stderr
            await wait_for(handle, "flaky", "dead_lettered")
        trail = await ledger.events(f"{run}/flaky")
    proofs = [(e.details or {})["signed"]["request"]["proof"] for e in trail if e.kind is EventKind.REDRIVEN]
    assert [p["generation"] for p in proofs] == [2, 4]
    ids = [p["decision_id"] for p in proofs]
    assert len(set(ids)) == 2 and all(len(i) == 32 for i in ids)


# -- the signature covers the id and the generation -------------------------------------------------


def test_a_changed_decision_id_or_generation_breaks_the_signature(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    key, public = _operator(tmp_path, private)
    verifier = DecisionVerifier("authenticated", {"alice": _public(public)})
    request = DecisionRequest(step_id="flaky", by="alice", reason="upstream fixed")
    payload = _signed(key, "run-1", "redrive", request, generation=2)
    expect = {"command": "redrive", "step_id": "flaky", "by": "alice", "reason": "upstream fixed"}
    now = datetime.now(UTC)

    def verify(proof_change: dict[str, Any]) -> str | None:
        changed = {**payload, "proof": {**payload["proof"], **proof_change}}
        return verifier.verify("run-1", SignedDecision(command="redrive", request=changed), expect=expect, at=now)

    assert verify({}) == "alice"
    with pytest.raises(DecisionRefusedError, match="bad signature"):
        verify({"decision_id": uuid.uuid4().hex})
    with pytest.raises(DecisionRefusedError, match="bad signature"):
        verify({"generation": 3})
    with pytest.raises(DecisionRefusedError, match="bad signature"):
        verify({"generation": None})
    # A proof with a valid signature but no decision id (as an agentlease before decision ids signed):
    # it could not be kept from applying again, so it is refused.
    message = signed_message("run-1", "redrive", request.model_dump(mode="json"), "alice", now.isoformat())
    old = {
        "operator": "alice",
        "signed_at": now.isoformat(),
        "signature": base64.b64encode(private.sign(message)).decode(),
    }
    unbound = {**request.model_dump(mode="json"), "proof": old}
    with pytest.raises(DecisionRefusedError, match="no decision id"):
        verifier.verify("run-1", SignedDecision(command="redrive", request=unbound), expect=expect, at=now)
    # ... while the entries such proofs wrote still verify (the message without an id is unchanged).
    assert verify_recorded(
        "run-1",
        {"signed_by": "alice", "signed": {"command": "redrive", "request": unbound}},
        {"alice": _public(public)},
        step_id=request.step_id,
        kind=EventKind.REDRIVEN,
    )


def _public(raw: str) -> Any:
    return load_public_keys(f"alice={raw}")["alice"]


# -- the activity: a Temporal retry of the same activity, and a replay by another ------------------


def _spec(run: str, step: str) -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{step}",
        agent_run_id=run,
        step_id=step,
        tool="send_mail",
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=f"{run}:{step}",
        lease_ttl=timedelta(minutes=1),
        arguments_sha256="a" * 64,
    )


def _scheduled(env: ActivityEnvironment, activity_id: str, attempt: int = 1) -> ActivityEnvironment:
    """``env`` as for the decision activity ``activity_id`` of run-1, scheduled now (``attempt``: Temporal's retry)."""
    env.info = dataclasses.replace(
        env.info,
        workflow_id="run-1",
        workflow_run_id="r1",
        activity_id=activity_id,
        attempt=attempt,
        scheduled_time=datetime.now(UTC),
    )
    return env


async def test_a_retry_of_the_same_activity_is_applied_and_another_activity_replays(
    ledger: Ledger, tmp_path: Path
) -> None:
    from agentlease.decisions._activity import DecisionActivities

    key, public = _operator(tmp_path)
    verifier = DecisionVerifier("authenticated", {"alice": _public(public)})
    [apply_decision, _] = DecisionActivities(ledger, verifier).activities()
    run = "run-1"
    spec = _spec(run, "gate")
    env = ActivityEnvironment()

    def scheduled(activity_id: str, attempt: int = 1) -> ActivityEnvironment:
        return _scheduled(env, activity_id, attempt)

    # The run parks the call for approval (its own decision, unsigned).
    parked = LedgerDecision(kind=DecisionKind.AWAIT_APPROVAL, task=spec, by="agentlease", reason="needs approval")
    await scheduled("1").run(apply_decision, parked.model_dump(mode="json"))

    request = DecisionRequest(step_id="gate", by="alice", reason="ticket OPS-1")
    payload = _signed(key, run, "approve", request, generation=0)
    approve = LedgerDecision(
        kind=DecisionKind.APPROVE,
        task=spec,
        by="alice",
        reason="ticket OPS-1",
        signed=SignedDecision(command="approve", request=payload),
    ).model_dump(mode="json")
    first = await scheduled("2").run(apply_decision, approve)
    assert first["status"] == TaskStatus.PENDING.value
    # Temporal retries the same activity (its result was lost): it still reports the decision applied.
    again = await scheduled("2", attempt=2).run(apply_decision, approve)
    assert again["status"] == TaskStatus.PENDING.value

    # The same signed approval scheduled by another update of the run: a replay, refused and recorded once.
    for activity_id in ("3", "4", "4"):
        with pytest.raises(ApplicationError) as refused:
            await scheduled(activity_id).run(apply_decision, approve)
        assert refused.value.non_retryable and refused.value.type == "DecisionRefused"
        assert "replayed" in refused.value.message
    trail = await ledger.events(spec.task_id)
    assert len([e for e in trail if e.kind is EventKind.APPROVED]) == 1
    [replayed] = [e for e in trail if e.kind is EventKind.DECISION_REFUSED]
    assert (replayed.details or {})["decision_id"] == payload["proof"]["decision_id"]
    assert (await ledger.get_task(spec.task_id)).status is TaskStatus.PENDING
    # The approved call is claimed, then Temporal retries the activity that approved it: still applied
    # (its decision is in the trail), not refused, not recorded as a replay.
    await ledger.claim(spec, "worker-a")
    late = await scheduled("2", attempt=3).run(apply_decision, approve)
    assert late["status"] == TaskStatus.RUNNING.value
    assert len([e for e in await ledger.events(spec.task_id) if e.kind is EventKind.DECISION_REFUSED]) == 1

    # Open mode, unsigned: no decision id, applied as before (a retry reports it applied).
    open_activities = DecisionActivities(ledger, DecisionVerifier())
    [open_apply, _] = open_activities.activities()
    other = _spec(run, "other")
    await scheduled("5").run(open_apply, parked.model_copy(update={"task": other}).model_dump(mode="json"))
    unsigned = LedgerDecision(kind=DecisionKind.APPROVE, task=other, by="bob", reason="typed")
    for activity_id in ("6", "6"):
        done = await scheduled(activity_id).run(open_apply, unsigned.model_dump(mode="json"))
        assert done["status"] == TaskStatus.PENDING.value


async def test_of_two_operators_reconciling_at_once_the_second_is_refused_not_told_done(
    ledger: Ledger, tmp_path: Path
) -> None:
    """Both confirms of a call parked for reconciliation reach the ledger; the second finds the task settled.
    It was reported applied (its sender saw exit 0) though nothing of it was recorded: what that person saw
    was lost. A Temporal retry of the first still reports it applied."""
    from agentlease.decisions._activity import DecisionActivities

    keys = {name: _operator(tmp_path, name=name) for name in ("alice", "bob")}
    verifier = DecisionVerifier("authenticated", load_public_keys(",".join(f"{n}={k[1]}" for n, k in keys.items())))
    env = ActivityEnvironment()

    def scheduled(activity_id: str, attempt: int = 1) -> ActivityEnvironment:
        return _scheduled(env, activity_id, attempt)

    async def parked(step: str) -> tuple[TaskSpec, int]:
        spec = _spec("run-1", step)
        claim = await ledger.claim(spec, "worker-a")
        await ledger.await_decision(
            claim, status=TaskStatus.NEEDS_RECONCILIATION, error_class=ErrorClass.AMBIGUOUS, error="sent, no answer"
        )
        return spec, claim.generation

    def confirm(spec: TaskSpec, by: str, seen: str, generation: int | None) -> dict[str, Any]:
        reason = f"{by} saw {seen}"
        signed = None
        if generation is not None:
            request = ReconcileRequest(step_id=spec.step_id, by=by, reason=reason, action="confirm", external_id=seen)
            payload = _signed(keys[by][0], "run-1", "reconcile", request, generation=generation)
            signed = SignedDecision(command="reconcile", request=payload)
        decision = LedgerDecision(
            kind=DecisionKind.CONFIRM, task=spec, by=by, reason=reason, external_id=seen, signed=signed
        )
        return decision.model_dump(mode="json")

    for mode, activities in (
        ("signed", DecisionActivities(ledger, verifier)),
        ("unsigned", DecisionActivities(ledger, DecisionVerifier())),
    ):
        [apply_decision, _] = activities.activities()
        spec, generation = await parked(f"charge-{mode}")
        bound = generation if mode == "signed" else None
        alice, bob = confirm(spec, "alice", "A-1", bound), confirm(spec, "bob", "B-1", bound)
        assert (await scheduled(f"{mode}-1").run(apply_decision, alice))["status"] == TaskStatus.SETTLED.value
        with pytest.raises(ApplicationError) as refused:
            await scheduled(f"{mode}-2").run(apply_decision, bob)
        assert refused.value.non_retryable and refused.value.type == "DecisionRefused", mode
        assert "another decision got there first" in refused.value.message, mode
        assert "was reconciled by 'alice' (alice saw A-1)" in refused.value.message, mode
        # Temporal retries the first (its result was lost): still applied.
        again = await scheduled(f"{mode}-1", attempt=2).run(apply_decision, alice)
        assert again["status"] == TaskStatus.SETTLED.value, mode
        reconciled = [e for e in await ledger.events(spec.task_id) if e.kind is EventKind.RECONCILED]
        assert [(e.details or {}).get("by") for e in reconciled] == ["alice"], mode
        stored = await ledger.receipt(spec.idempotency_key)
        assert stored is not None and stored.receipt.external_id == "A-1", mode


async def test_a_retry_of_an_applied_decision_is_applied_whoever_came_after(ledger: Ledger, tmp_path: Path) -> None:
    """Retries the refusal of a second decision must not catch: an approval signed by an operator the worker holds
    no key for (open mode: no verified id), and the first of two approvals a call needs, retried after the second
    completed it. Each was refused "another decision got there first", the run left waiting on a call the ledger
    had approved."""
    from agentlease.decisions._activity import DecisionActivities

    key, _ = _operator(tmp_path)
    [apply_decision, _] = DecisionActivities(ledger, DecisionVerifier()).activities()  # open mode, no keys
    env = ActivityEnvironment()

    async def run(decision: LedgerDecision, activity_id: str, attempt: int = 1) -> str:
        scheduled = _scheduled(env, activity_id, attempt)
        return str((await scheduled.run(apply_decision, decision.model_dump(mode="json")))["status"])

    async def parked(step: str, approvals: int) -> TaskSpec:
        spec = _spec("run-1", step)
        request = ApprovalRequest(tool=spec.tool, arguments={}, arguments_sha256="a" * 64, approvals_required=approvals)
        gate = LedgerDecision(kind=DecisionKind.AWAIT_APPROVAL, task=spec, by="agentlease", reason="gate")
        await run(gate.model_copy(update={"request": request}), f"park-{step}")
        return spec

    spec = await parked("signed", 1)
    request = DecisionRequest(step_id="signed", by="alice", reason="ticket OPS-1")
    signed = SignedDecision(command="approve", request=_signed(key, "run-1", "approve", request, generation=0))
    approve = LedgerDecision(kind=DecisionKind.APPROVE, task=spec, by="alice", reason="ticket OPS-1", signed=signed)
    assert [await run(approve, "a1"), await run(approve, "a1", attempt=2)] == ["pending", "pending"]

    spec = await parked("two", 2)
    alice = LedgerDecision(kind=DecisionKind.APPROVE, task=spec, by="alice", reason="looks right")
    bob = LedgerDecision(kind=DecisionKind.APPROVE, task=spec, by="bob", reason="agreed")
    assert [await run(alice, "b1"), await run(bob, "b2")] == ["awaiting_approval", "pending"]
    assert await run(alice, "b1", attempt=2) == "pending"
    with pytest.raises(ApplicationError, match="another decision got there first"):
        await run(alice.model_copy(update={"by": "carol"}), "b3")  # a third person, after it was complete

    # Two rounds of reconciliation: alice's new decision in the second, after bob's applied, is not her first
    # round's entry (same name and reason), which it was taken for.
    spec = _spec("run-1", "rounds")
    alice = LedgerDecision(kind=DecisionKind.RETRY, task=spec, by="alice", reason="checked, not sent")
    bob = LedgerDecision(kind=DecisionKind.RETRY, task=spec, by="bob", reason="checked again")
    for n, decision in enumerate((alice, bob)):
        claim = await ledger.claim(spec, "worker-a")
        await ledger.await_decision(
            claim, status=TaskStatus.NEEDS_RECONCILIATION, error_class=ErrorClass.AMBIGUOUS, error="no answer"
        )
        assert await run(decision, f"c{n}") == "released"
    with pytest.raises(ApplicationError, match="was reconciled by 'bob'"):
        await run(alice, "c2")


# -- the migration and the worker role ------------------------------------------------------------


async def test_the_migration_upgrades_a_0006_ledger(ledger_url: str) -> None:
    ledger = Ledger.from_url(ledger_url)
    try:
        await upgrade(ledger.database, "0006")

        def old_row(conn: Any) -> None:  # a task waiting for approval, as a 0006 ledger holds it
            conn.execute(
                text(
                    "INSERT INTO tasks (task_id, agent_run_id, step_id, tool, side_effect_class, status, lease_ttl_ms, "
                    "claim_generation, attempts, renewal_count, idempotency_key, created_at_ms, updated_at_ms) "
                    "VALUES ('run-old/mail', 'run-old', 'mail', 'send_mail', 'unsafe', 'awaiting_approval', 60000, "
                    "0, 0, 0, 'run-old:mail', 1, 1)"
                )
            )

        await ledger.database.write(old_row)
        await upgrade(ledger.database)
        task = await ledger.get_task("run-old/mail")
        assert (task.status, task.approval_request) == (TaskStatus.AWAITING_APPROVAL, None)

        def rows(conn: Any) -> list[Any]:
            conn.execute(
                text(
                    "INSERT INTO decisions_applied (decision_id, task_id, kind, operator, generation, applied_at_ms) "
                    "VALUES ('d' || '1', 'run-old/mail', 'approve', 'alice', 0, 1)"
                )
            )
            return list(conn.execute(text("SELECT decision_id, task_id FROM decisions_applied")))

        assert [tuple(r) for r in await ledger.database.write(rows)] == [("d1", "run-old/mail")]
    finally:
        await ledger.close()


def _dsn(url: str, role: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    return (parsed.set(username=role) if role else parsed).render_as_string(hide_password=False)


@pytest.mark.postgres
async def test_the_worker_role_may_insert_decision_ids_but_not_change_them(pg_url: str) -> None:
    role = f"agentlease_worker_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(_dsn(pg_url))
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    ledger = Ledger.from_url(pg_url)
    try:
        await upgrade(ledger.database)
        for statement in grant_statements(LedgerRoles(worker=role)):
            await admin.execute(statement)
        worker = await asyncpg.connect(_dsn(pg_url, role))
        try:
            for table in ("decisions_applied", "decision_replays"):
                await worker.execute(
                    f"INSERT INTO {table} (decision_id, task_id, kind, operator, generation, "
                    f"{'applied_at_ms' if table == 'decisions_applied' else 'refused_at_ms'}) "
                    "VALUES ('d1', 'run-1/mail', 'redrive', 'alice', 2, 1)"
                )
                assert await worker.fetchval(f"SELECT count(*) FROM {table}") == 1
                for forbidden in (
                    f"UPDATE {table} SET task_id = 'run-2/mail'",
                    f"UPDATE {table} SET decision_id = 'd2'",
                    f"DELETE FROM {table}",
                    f"TRUNCATE {table}",
                ):
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await worker.execute(forbidden)
                assert await admin.fetchval(f"SELECT count(*) FROM {table} WHERE decision_id = 'd1'") == 1
        finally:
            await worker.close()
    finally:
        await ledger.close()
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()


async def test_a_signed_cancel_of_the_whole_run_applies_once_to_each_task(ledger: Ledger, tmp_path: Path) -> None:
    """One decision id, one use per task: the run's cancel reaches each of its steps, and only once."""
    from agentlease.decisions._activity import DecisionActivities
    from agentlease.decisions.table import CancelRequest

    key, public = _operator(tmp_path)
    [apply_decision, _] = DecisionActivities(
        ledger, DecisionVerifier("authenticated", {"alice": _public(public)})
    ).activities()
    env = ActivityEnvironment()
    request = CancelRequest(by="alice", reason="stop the run")
    proof = key.sign("run-1", "cancel", request.model_dump(mode="json"))
    signed = SignedDecision(
        command="cancel", request={**request.model_dump(mode="json"), "proof": proof.model_dump(mode="json")}
    )
    assert proof.generation is None and proof.decision_id is not None
    for n, step in enumerate(("a", "b", "a")):
        env.info = dataclasses.replace(
            env.info, workflow_id="run-1", workflow_run_id="r1", activity_id=str(n), scheduled_time=datetime.now(UTC)
        )
        cancel = LedgerDecision(
            kind=DecisionKind.CANCEL, task=_spec("run-1", step), by="alice", reason="stop the run", signed=signed
        )
        if n < 2:
            done = await env.run(apply_decision, cancel.model_dump(mode="json"))
            assert done["status"] == TaskStatus.CANCELLED.value  # pending: nothing can have happened
        else:
            with pytest.raises(ApplicationError, match="replayed"):
                await env.run(apply_decision, cancel.model_dump(mode="json"))


async def test_a_decision_bound_to_a_generation_checks_it_in_its_own_transaction(ledger: Ledger) -> None:
    """The generation a signed decision was made for is checked under the row's lock, with the decision:
    a claim between the id's record and the decision cannot slip a stale decision through."""
    spec = _spec("run-g", "gate")
    await ledger.claim(spec, "worker-a")  # generation 1
    await ledger.decide(spec.task_id, DecisionKind.CANCEL, by="sweeper", reason="park it", expected_generation=1)
    moved = _spec("run-g", "moved")
    await ledger.claim(moved, "worker-a")
    with pytest.raises(TaskMovedError) as refused:
        await ledger.decide(moved.task_id, DecisionKind.CANCEL, by="alice", reason="stale", expected_generation=0)
    assert (refused.value.expected, refused.value.actual) == (0, 1)
    assert (await ledger.get_task(moved.task_id)).status is TaskStatus.RUNNING  # nothing changed
    assert [e.kind for e in await ledger.events(moved.task_id)] == [EventKind.CLAIMED]
    assert (await ledger.get_task(spec.task_id)).status is TaskStatus.CANCELLED
