"""With the worker role's credentials on PostgreSQL, an operator's signed decision copied into another
entry does not prove that entry's signer (found by an attack; failed before the fix).

``docs/security-review.md`` ("What a worker's database role can still do"): "A signed approval entry
carries its proof, so an approval the role forged names no signer (or fails ``verify_recorded``)".
But the row guard only checks that ``signed_by``
equals the operator named in ``details.signed``, and ``verify_recorded`` checked only the signature over (run,
command, request): not that the entry is of the request's step, nor of its command. So the worker role, doing
what the decision activity does (``Ledger.decide`` as that role), writes "approved" on step ``b`` with alice's
signed approval of step ``a`` (and with alice's signed *reject* of ``c``), and ``verify_recorded`` says alice
signed both.
Now :func:`agentlease.decisions.table.verify_recorded` refuses an entry whose step or kind is not the signed one's,
and the row guard refuses an entry naming a signer whose signed request names another step.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.engine import make_url
from temporalio.testing import ActivityEnvironment

from agentlease.decisions._activity import DecisionActivities
from agentlease.decisions.table import DecisionRequest, LedgerDecision, verify_recorded
from agentlease.enums import DecisionKind, EventKind, SideEffectClass, TaskStatus
from agentlease.ledger.grants import LedgerRoles, grant_statements
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import TaskSpec
from agentlease.security.decision_auth import DecisionVerifier, OperatorKey, SignedDecision, load_public_keys

RUN = "run-1"


def _dsn(url: str, role: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    return (parsed.set(username=role) if role else parsed).render_as_string(hide_password=False)


def _spec(step: str) -> TaskSpec:
    return TaskSpec(
        task_id=f"{RUN}/{step}",
        agent_run_id=RUN,
        step_id=step,
        tool="send_mail",
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=f"{RUN}:{step}",
        lease_ttl=timedelta(minutes=1),
    )


@pytest.mark.postgres
async def test_a_copied_signed_decision_does_not_prove_another_entry(pg_url: str, tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "alice.key").write_bytes(b"agentlease-operator: alice\n" + pem)
    key = OperatorKey(tmp_path / "alice.key")
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    keys = load_public_keys(f"alice={base64.b64encode(raw).decode()}")

    role = f"agentlease_worker_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(_dsn(pg_url))
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    owner = Ledger.from_url(pg_url)
    worker: Ledger | None = None
    try:
        await upgrade(owner.database)
        for statement in grant_statements(LedgerRoles(worker=role)):
            await admin.execute(statement)
        worker = Ledger.from_url(make_url(pg_url).set(username=role).render_as_string(hide_password=False))
        # The operator's genuine decisions, applied by the decision activity: approve a, reject c.
        [apply_decision, _] = DecisionActivities(owner, DecisionVerifier("authenticated", keys)).activities()
        env = ActivityEnvironment()
        signed = {}
        for n, (step, command, kind) in enumerate(
            (("a", "approve", DecisionKind.APPROVE), ("c", "reject", DecisionKind.REJECT))
        ):
            await owner.decide(
                _spec(step).task_id, DecisionKind.AWAIT_APPROVAL, by="agentlease", reason="gate", spec=_spec(step)
            )
            request = DecisionRequest(step_id=step, by="alice", reason=f"{command} {step}").model_dump(mode="json")
            proof = key.sign(RUN, command, request, generation=0)
            signed[step] = SignedDecision(command=command, request={**request, "proof": proof.model_dump(mode="json")})
            env.info = dataclasses.replace(
                env.info, workflow_id=RUN, workflow_run_id="r1", activity_id=str(n), scheduled_time=datetime.now(UTC)
            )
            await env.run(
                apply_decision,
                LedgerDecision(
                    kind=kind, task=_spec(step), by="alice", reason=f"{command} {step}", signed=signed[step]
                ).model_dump(mode="json"),
            )

        # Her genuine entries are proven, for their own step and kind only: her approval of a does not prove
        # an approval of b, nor her rejection of c an approval of d.
        for step, event in (("a", EventKind.APPROVED), ("c", EventKind.REJECTED)):
            [entry] = [e for e in await owner.events(_spec(step).task_id) if e.kind is event]
            details = entry.details or {}
            assert verify_recorded(RUN, details, keys, step_id=step, kind=event)
            other = {"a": "b", "c": "d"}[step]
            assert not verify_recorded(RUN, details, keys, step_id=other, kind=event)
            assert not verify_recorded(RUN, details, keys, step_id=step, kind=EventKind.REDRIVEN)
        assert not verify_recorded(
            RUN, dict(details, signed=signed["c"].model_dump(mode="json")), keys, step_id="c", kind=EventKind.APPROVED
        )

        # Steps b and d wait for an approval alice never gave; the worker role tries to approve them "as
        # alice", with her approval of a (another step) and her rejection of c (another step and command):
        # the trail's guard refuses the entry, and nothing changes.
        for copied, target in (("a", "b"), ("c", "d")):
            await owner.decide(
                _spec(target).task_id, DecisionKind.AWAIT_APPROVAL, by="agentlease", reason="gate", spec=_spec(target)
            )
            with pytest.raises(Exception, match="signed decision of step") as refused:
                await worker.decide(
                    _spec(target).task_id,
                    DecisionKind.APPROVE,
                    by="alice",
                    reason="ticket OPS-1",
                    details={"signed_by": "alice", "signed": signed[copied].model_dump(mode="json")},
                )
            assert "agentlease ledger guard" in str(refused.value)
            assert (await owner.get_task(_spec(target).task_id)).status is TaskStatus.AWAITING_APPROVAL
    finally:
        if worker is not None:
            await worker.close()
        await owner.close()
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()
