"""Proofs of lease progress signals (``agentlease/security/progress.py``) and the run's check of them."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from temporalio import workflow

from agentlease.enums import Stage
from agentlease.records import LeaseProgress, TaskView, ToolCall
from agentlease.security.progress import mint_secret, prove, proven, step_key
from agentlease.workflow._status import ProgressProofs, refused_writes_line

SECRET = mint_secret()
KEY = step_key(SECRET, "write")
GENUINE = LeaseProgress(
    step_id="write", claim_generation=2, lease_owner="worker-b", stage=Stage.EXTERNAL_CALL, reason="uploading"
)
VIEWS = {"write": TaskView(task_id="r/write", step_id="write", tool="t", status="running", idempotency_key="r:write")}


def test_a_proof_verifies_only_with_its_key_and_its_fields() -> None:
    signed = prove(KEY, GENUINE)
    assert signed.proof is not None and len(signed.proof) == 64
    assert proven(KEY, signed)
    assert not proven(KEY, GENUINE)  # no proof
    assert not proven(step_key(SECRET, "other"), signed)  # another step's key
    assert not proven(step_key(mint_secret(), "write"), signed)  # another run's
    changes: list[dict[str, Any]] = [
        {"claim_generation": 999},
        {"lease_owner": "mallory"},
        {"stage": Stage.VERIFY},
        {"reason": "safe to approve"},
        {"refused_writes": 5},
        {"step_id": "other"},
    ]
    for change in changes:
        assert not proven(KEY, signed.model_copy(update=change)), change
    # A proof survives the trip through JSON (what the signal carries).
    assert proven(KEY, LeaseProgress.model_validate(signed.model_dump(mode="json")))


def test_keys_differ_per_step_and_per_secret() -> None:
    assert len({step_key(SECRET, "a"), step_key(SECRET, "b"), step_key(mint_secret(), "a")}) == 3
    assert len(SECRET) == 64
    assert mint_secret() != SECRET


def test_a_call_carries_its_key_but_never_shows_it() -> None:
    call = ToolCall(
        task_id="r/write", agent_run_id="r", step_id="write", tool="t", arguments={}, idempotency_key="r:write",
        progress_key=KEY,
    )  # fmt: skip
    assert KEY not in repr(call)
    with pytest.raises(ValueError, match="progress_key"):
        ToolCall.model_validate({**call.model_dump(), "progress_key": "not a key"})


def test_the_run_believes_only_proven_progress_and_counts_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workflow, "logger", logging.getLogger("test"))  # outside a workflow
    proofs = ProgressProofs()
    # Before its secret is minted the run scheduled nothing: nothing is believed.
    assert proofs.accepted(prove(KEY, GENUINE).model_dump(mode="json"), VIEWS) is None
    proofs._secret = SECRET
    assert proofs.accepted(prove(KEY, GENUINE).model_dump(mode="json"), VIEWS) == prove(KEY, GENUINE)
    spoofs: list[Any] = [
        GENUINE.model_dump(mode="json"),
        {**GENUINE.model_dump(mode="json"), "proof": "0" * 64},
        prove(step_key(SECRET, "nope"), GENUINE.model_copy(update={"step_id": "nope"})).model_dump(mode="json"),
        {"step_id": "write"},
        "garbage",
    ]
    for spoof in spoofs:
        assert proofs.accepted(spoof, VIEWS) is None, spoof
    assert proofs.refused == 1 + len(spoofs)
    assert proofs.line() == "6 lease progress signals refused (no proof of the lease)"


def test_refused_writes_lines() -> None:
    views = {
        "a": VIEWS["write"].model_copy(update={"step_id": "a", "refused_writes": 1}),
        "b": VIEWS["write"].model_copy(update={"step_id": "b"}),
        "c": VIEWS["write"].model_copy(update={"step_id": "c", "refused_writes": 3}),
    }
    assert refused_writes_line(views) == ["a: 1 late write refused", "c: 3 late writes refused"]
