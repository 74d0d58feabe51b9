"""Issue 21, the workflow side: a malformed-ciphertext signal or start input fails only itself (the run goes
on); a flood of refused ``decide`` signals costs a bounded number of history events and trail entries; the
last decision in search attributes carries no free text. Real dev server, a worker with the codec."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Sequence

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.worker import Worker

from agentlease.decisions.table import DecisionRequest
from agentlease.ledger.store import Ledger
from agentlease.plugin import AgentLeasePlugin
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.runtime.names import AGENT_RUN_WORKFLOW, DECIDE_SIGNAL
from agentlease.runtime.temporal import connect
from agentlease.security.codec import ENCODING, KEY_ID, EncryptionCodec
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import ToolRegistry, load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(120)

KEY = "k1:" + base64.b64encode(b"1" * 32).decode()


class Garbling(PayloadCodec):
    """What an attacker without the key sends: every payload a 1-byte "ciphertext" of key k1."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [Payload(metadata={"encoding": ENCODING, KEY_ID: b"k1"}, data=b"x") for _ in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


async def _status(handle: object) -> RunStatus:
    return RunStatus.model_validate(await handle.query("status"))  # type: ignore[attr-defined]


def _users_own_worker(client: Client, ledger: Ledger, registry: ToolRegistry, settings: AgentLeaseSettings) -> Worker:
    """A worker as a team writes it: its own ``Worker``, the plugin beside its workflows."""
    plugin = AgentLeasePlugin(settings=settings, ledger=ledger, tools=registry, agent_run_workflow=True)
    return Worker(client, task_queue=settings.task_queue, plugins=[plugin])


@pytest.mark.parametrize("worker_of", [build_worker, _users_own_worker], ids=["agentlease-worker", "plugin"])
async def test_malformed_ciphertext_signal_and_start_fail_only_themselves(
    settings: AgentLeaseSettings, temporal_address: str, worker_of: Callable[..., Worker]
) -> None:
    settings = settings.model_copy(update={"codec_keys": KEY})
    client = await connect(settings)
    codec = client.data_converter.payload_codec
    assert isinstance(codec, EncryptionCodec) and not codec.is_lenient  # the client stays strict
    attacker = await Client.connect(
        temporal_address, data_converter=DataConverter(payload_codec=Garbling()), namespace=settings.namespace
    )
    registry = load_registry(["tests.security.round2_tools"])
    run_id = f"wedge-{uuid.uuid4().hex[:8]}"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="mail", tool="gated_mail", arguments={"to": "a"})])
    async with opened_ledger(settings) as ledger, worker_of(client, ledger, registry, settings):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

        async def waiting() -> None:
            assert (await _status(handle)).tasks[0].status == "awaiting_approval"

        await assert_eventually(waiting, timeout=30)
        for name in (DECIDE_SIGNAL, "close", "agentlease.lease_progress"):
            await attacker.get_workflow_handle(run_id).signal(name, {"decision": "approve"})

        async def refused() -> None:
            status = await _status(handle)
            assert status.refused and "undecodable payload" in status.refused[-1].refusal, status.refused

        await assert_eventually(refused, timeout=30)
        request = DecisionRequest(step_id="mail", by="alice", reason="token hunter2 ok")
        decided = RunStatus.model_validate(await handle.execute_update("reject", request, result_type=dict))
        assert decided.tasks[0].status == "rejected"
        assert (await handle.describe()).search_attributes.get("AgentLeaseDecision") == ["mail: rejected"]

        bad_start = f"wedge-start-{uuid.uuid4().hex[:8]}"
        started = await attacker.start_workflow(
            AGENT_RUN_WORKFLOW, {"agent_run_id": bad_start}, id=bad_start, task_queue=settings.task_queue
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await client.get_workflow_handle(started.id).result()
        assert "undecodable plan payload" in str(failed.value.cause)


async def test_refused_signal_flood_is_bounded(settings: AgentLeaseSettings) -> None:
    client = await connect(settings)
    registry = load_registry(["tests.security.round2_tools"])
    run_id = f"flood-{uuid.uuid4().hex[:8]}"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="mail", tool="gated_mail", arguments={"to": "a"})])
    flood = 40
    async with opened_ledger(settings) as ledger, build_worker(client, ledger, registry, settings):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

        async def waiting() -> None:
            assert (await _status(handle)).tasks[0].status == "awaiting_approval"

        await assert_eventually(waiting, timeout=30)
        before = len((await handle.fetch_history()).events)
        for n in range(flood):
            await handle.signal(DECIDE_SIGNAL, {"decision": "redrive", "step_id": "mail", "by": f"m{n}", "reason": "x"})

        async def counted() -> None:
            assert (await _status(handle)).refused_count == flood

        await assert_eventually(counted, timeout=30)
        after = len((await handle.fetch_history()).events)
        # Per refused signal: its own event and at most one workflow task (3 events); one summary activity.
        assert after - before <= 4 * flood + 8, (before, after)
        refusals = [e for e in await ledger.events(f"{run_id}/mail") if e.kind.value == "decision_refused"]
        assert 1 <= len(refusals) <= 2, refusals
