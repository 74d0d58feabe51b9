"""Authenticated decisions on the real dev server (finding 5): in the authenticated mode an unsigned
decision, a forged signature, a signature moved to another step and a stale one are refused and
change nothing; a decision the CLI signs with an operator's key applies, and the trail names the
key's operator whatever ``--by`` says."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client, WorkflowUpdateFailedError

from agentlease.decisions.table import DecisionRequest
from agentlease.enums import EventKind, TaskStatus
from agentlease.settings import AgentLeaseSettings
from tests.integration.test_decisions import running, wait_for
from tests.security.edge_cli import agentlease

pytestmark = pytest.mark.timeout(150)

STEPS = (("mail", "send_once", {"hold_first_attempt": False}), ("other", "send_once", {"hold_first_attempt": False}))


def _raw_public(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


async def _refused(handle: object, update: str, payload: object, why: str) -> None:
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await handle.execute_update(update, payload)  # type: ignore[attr-defined]
    cause = info.value.cause
    text = f"{cause} {getattr(cause, 'cause', '')}"
    assert why in text, text


async def test_unsigned_decisions_are_refused_in_authenticated_mode(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    alice = Ed25519PrivateKey.generate()
    settings = settings.model_copy(
        update={"decision_mode": "authenticated", "operator_keys": f"alice={_raw_public(alice)}"}
    )
    async with running(client, settings, *STEPS) as (handle, ledger, run):
        await wait_for(handle, "mail", "awaiting_approval")
        # Anyone who can send updates types a name: refused, nothing recorded.
        await _refused(handle, "approve", {"step_id": "mail", "by": "alice", "reason": "trust me"}, "unsigned decision")
        await _refused(handle, "cancel", {"by": "alice", "reason": "stop it"}, "unsigned decision")
        task = await ledger.get_task(f"{run}/mail")
        assert task.status is TaskStatus.AWAITING_APPROVAL
        trail = await ledger.events(f"{run}/mail")
        assert not [e for e in trail if e.kind in (EventKind.APPROVED, EventKind.CANCELLED)]
        status = await handle.query("status")
        assert status["status"] == "waiting", status  # the refused cancel of the run left it running

        from agentlease.security.decision_auth import OperatorKey, new_operator_keys

        # A key the workers do not know, claiming to be alice: a bad signature.
        _, _ = new_operator_keys("alice", tmp_path / "mallory")
        forged_key = OperatorKey(tmp_path / "mallory" / "alice.key")
        request = DecisionRequest(step_id="mail", by="alice", reason="forged")
        forged = request.model_copy(update={"proof": forged_key.sign(run, "approve", request.model_dump(mode="json"))})
        await _refused(handle, "approve", forged.model_dump(mode="json"), "bad signature of operator 'alice'")

        # Alice's real signature of "other", sent for "mail": the signed decision does not match.
        real = _operator_file(alice, tmp_path / "alice.key")
        for_other = DecisionRequest(step_id="other", by="alice", reason="ok")
        proof = real.sign(run, "approve", for_other.model_dump(mode="json"))
        moved = {**for_other.model_dump(mode="json"), "step_id": "mail", "proof": proof.model_dump(mode="json")}
        await _refused(handle, "approve", moved, "bad signature")
        # Alice's approval of "mail" sent as a reject: signed for another command, refused.
        approval = DecisionRequest(step_id="mail", by="alice", reason="ok")
        signed_approval = {
            **approval.model_dump(mode="json"),
            "proof": real.sign(run, "approve", approval.model_dump(mode="json")).model_dump(mode="json"),
        }
        await _refused(handle, "reject", signed_approval, "bad signature")

        # A signature older than the allowed age: a replay, refused.
        stale_request = DecisionRequest(step_id="mail", by="alice", reason="old")
        stale = stale_request.model_copy(
            update={
                "proof": real.sign(
                    run, "approve", stale_request.model_dump(mode="json"), now=datetime.now(UTC) - timedelta(hours=1)
                )
            }
        )
        await _refused(handle, "approve", stale.model_dump(mode="json"), "stale or replayed")
        assert (await ledger.get_task(f"{run}/mail")).status is TaskStatus.AWAITING_APPROVAL

        # Alice's signature, as made: applied, and the trail says it was verified.
        good_request = DecisionRequest(step_id="mail", by="alice", reason="ticket OPS-9")
        good = good_request.model_copy(
            update={"proof": real.sign(run, "approve", good_request.model_dump(mode="json"))}
        )
        await handle.execute_update("approve", good.model_dump(mode="json"))
        [approved] = [e for e in await ledger.events(f"{run}/mail") if e.kind is EventKind.APPROVED]
        assert (approved.details or {}).get("by") == "alice"
        assert (approved.details or {}).get("signed_by") == "alice"


def _operator_file(key: Ed25519PrivateKey, path: Path) -> Any:
    """``key`` written as ``agentlease keys new-operator`` writes a private key, loaded back."""
    from agentlease.security.decision_auth import OperatorKey

    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"agentlease-operator: alice\n" + pem)
    return OperatorKey(path)


async def test_the_cli_signs_with_the_operator_key(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, temporal_address: str
) -> None:
    made = await agentlease("keys", "new-operator", "alice", "--dir", str(tmp_path / "keys"), env={})
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "keys" / "alice.key").stat().st_mode & 0o077 == 0  # private to its owner
    again = await agentlease("keys", "new-operator", "alice", "--dir", str(tmp_path / "keys"), env={})
    assert again.returncode == 2 and "exists already" in again.stderr and len(again.stderr.strip().splitlines()) == 1

    settings = settings.model_copy(
        update={"decision_mode": "authenticated", "operator_keys": f"alice={tmp_path / 'keys' / 'alice.pub'}"}
    )
    env = {
        "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address,
        "AGENTLEASE_TASK_QUEUE": settings.task_queue,
        "AGENTLEASE_LEDGER_URL": settings.ledger_url,
    }
    async with running(client, settings, *STEPS) as (handle, ledger, run):
        await wait_for(handle, "mail", "awaiting_approval")
        unsigned = await agentlease("approve", run, "mail", "--by", "alice", "--reason", "typed", env=env)
        assert unsigned.returncode == 2, unsigned
        assert "approve refused" in unsigned.stderr and "unsigned decision" in unsigned.stderr
        assert len(unsigned.stderr.strip().splitlines()) == 1, unsigned.stderr

        signed_env = {**env, "AGENTLEASE_OPERATOR_KEY": str(tmp_path / "keys" / "alice.key")}
        impostor = await agentlease("approve", run, "mail", "--by", "bob", "--reason", "x", env=signed_env)
        assert impostor.returncode == 2 and "the operator is the key's" in impostor.stderr

        approved = await agentlease("approve", run, "mail", "--reason", "ticket OPS-10", env=signed_env)
        assert approved.returncode == 0, approved.stderr
        await wait_for(handle, "other", "awaiting_approval")
        rejected = await agentlease("reject", run, "other", "--reason", "not needed", env=signed_env)
        assert rejected.returncode == 0, rejected.stderr
        result = await asyncio.wait_for(handle.result(), timeout=60)
        trail = await ledger.events(f"{run}/mail")
    assert [(t.step_id, t.status) for t in result.tasks] == [("mail", "settled"), ("other", "rejected")]
    [decided] = [e for e in trail if e.kind is EventKind.APPROVED]
    details = dict(decided.details or {})
    signed = details.pop("signed")  # the signed request beside the name (the ledger's guard wants it)
    approval = details.pop("approval")  # one approval of the one the tool asks for
    assert details == {"by": "alice", "decision": "approve", "signed_by": "alice"}
    assert (approval["given"], approval["required"]) == (1, 1) and approval["expires_at_ms"] > 0
    assert signed["command"] == "approve" and signed["request"]["proof"]["operator"] == "alice"
    assert decided.reason == "ticket OPS-10"


def test_the_open_mode_is_the_default_and_authenticated_needs_keys() -> None:
    from agentlease.errors import ConfigurationError
    from agentlease.security.decision_auth import DecisionVerifier, decision_verifier

    assert AgentLeaseSettings().decision_mode == "open"
    assert decision_verifier(AgentLeaseSettings()).verify("r", None, expect={}, at=datetime.now(UTC)) is None
    with pytest.raises(ConfigurationError, match="needs AGENTLEASE_OPERATOR_KEYS"):
        DecisionVerifier("authenticated")
    with pytest.raises(ConfigurationError, match="bad AGENTLEASE_OPERATOR_KEYS entry"):
        decision_verifier(AgentLeaseSettings(decision_mode="authenticated", operator_keys="alice"))
    with pytest.raises(ConfigurationError, match="neither a file nor a base64"):
        decision_verifier(AgentLeaseSettings(decision_mode="authenticated", operator_keys="alice=nope!"))


def test_an_operator_key_file_over_the_bound_is_refused(tmp_path: Path) -> None:
    """The worker's ``AGENTLEASE_OPERATOR_KEYS`` files and the CLI's own key are read at most to their bound."""
    from agentlease import limits
    from agentlease.errors import ConfigurationError
    from agentlease.security.decision_auth import OperatorKey, load_public_keys

    big = tmp_path / "alice.pub"
    big.write_bytes(b"agentlease-operator: alice\n" + b"x" * limits.MAX_KEY_FILE_BYTES)
    with pytest.raises(
        ConfigurationError, match=f"OPERATOR_KEYS: cannot read .*: larger than {limits.MAX_KEY_FILE_BYTES}"
    ):
        load_public_keys(f"alice={big}")
    with pytest.raises(
        ConfigurationError, match=f"OPERATOR_KEY: cannot read .*: larger than {limits.MAX_KEY_FILE_BYTES}"
    ):
        OperatorKey(big)


def test_a_signed_request_applies_only_to_the_decision_it_names(tmp_path: Path) -> None:
    """Another workflow on the task queue schedules the decision activity itself, with a real signed
    request of another step: the activity's check refuses it (the signature is valid, the binding is not)."""
    from agentlease.decisions._activity import authenticate
    from agentlease.decisions.table import LedgerDecision, ReconcileRequest
    from agentlease.enums import DecisionKind, SideEffectClass
    from agentlease.records import TaskSpec
    from agentlease.security.decision_auth import DecisionRefusedError, DecisionVerifier, SignedDecision

    alice = Ed25519PrivateKey.generate()
    key = _operator_file(alice, tmp_path / "alice.key")
    verifier = DecisionVerifier("authenticated", {"alice": alice.public_key()})
    request = ReconcileRequest(step_id="other", by="alice", reason="seen", action="confirm", external_id="ext-1")
    signed = SignedDecision(
        command="reconcile",
        request={
            **request.model_dump(mode="json"),
            "proof": key.sign("run-1", "reconcile", request.model_dump(mode="json")).model_dump(mode="json"),
        },
    )

    def decision(step: str, **change: Any) -> LedgerDecision:
        task = TaskSpec(
            task_id=f"run-1/{step}",
            agent_run_id="run-1",
            step_id=step,
            tool="t",
            side_effect_class=SideEffectClass.UNSAFE,
            idempotency_key=f"run-1:{step}",
            lease_ttl=timedelta(seconds=5),
        )
        fields = {"kind": DecisionKind.CONFIRM, "by": "alice", "reason": "seen", "external_id": "ext-1", **change}
        return LedgerDecision(task=task, signed=signed, **fields)

    assert authenticate(verifier, decision("other")) == "alice"
    with pytest.raises(DecisionRefusedError, match="step_id differs"):
        authenticate(verifier, decision("mail"))
    with pytest.raises(DecisionRefusedError, match="external_id differs"):
        authenticate(verifier, decision("other", external_id="ext-2"))
    with pytest.raises(DecisionRefusedError, match="action differs"):
        authenticate(verifier, decision("other", kind=DecisionKind.ABANDON))
    with pytest.raises(DecisionRefusedError, match="unsigned"):
        authenticate(verifier, decision("other").model_copy(update={"signed": None}))
