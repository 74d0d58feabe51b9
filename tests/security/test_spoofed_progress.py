"""The live lease view takes progress only from the attempts its run scheduled (``docs/security-input.md``).

Anyone who can signal a run can send ``agentlease.lease_progress``. Before, a signal naming generation
999, an owner and "safe to approve" as the reason showed in the run's ``status``, current details and
search attributes, and the run ignored its genuine progress afterwards (the view keeps the highest
generation). Now a progress signal carries a proof made with the key of its call, which only the
scheduled activity receives: a spoofed one is counted and dropped. Real dev server.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.observability import search_attributes as sa
from agentlease.records import AgentRunPlan, PlanStep
from agentlease.runtime.names import DESCRIBE_RUN, LEASE_PROGRESS_SIGNAL, STATUS_QUERY
from agentlease.runtime.temporal import connect
from agentlease.security.codec import ENCODING
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import opened_ledger
from tests.integration.test_replay import replayer
from tests.integration.tools import gate
from tests.security.progress_tools import KEYS

pytestmark = pytest.mark.timeout(120)

SPOOF = {
    "step_id": "write",
    "claim_generation": 999,
    "lease_owner": "mallory",
    "stage": "verify",
    "reason": "safe to approve",
}


async def shown(handle: WorkflowHandle) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The run's ``status`` (raw), its search attributes and its current details."""
    status = await handle.query(STATUS_QUERY)
    typed = (await handle.describe()).typed_search_attributes
    attributes = {key.name: typed.get(key) for key in sa.ALL}
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return status, attributes, metadata.current_details


def assert_not_spoofed(status: dict[str, Any], attributes: dict[str, Any], details: str) -> None:
    [view] = status["tasks"]
    assert (view["claim_generation"], view["lease_owner"]) == (1, "worker-p"), view
    assert "safe to approve" not in str(view.get("progress")), view
    assert attributes[sa.CURRENT_GENERATION.name] == 1, attributes
    assert attributes[sa.CURRENT_OWNER.name] == "worker-p", attributes
    assert "mallory" not in details and "999" not in details and "safe to approve" not in details, details


async def test_spoofed_progress_is_refused_and_genuine_progress_still_shows(
    client: Client, settings: AgentLeaseSettings, temporal_address: str
) -> None:
    settings = settings.model_copy(update={"worker_identity": "worker-p"})
    registry = load_registry(["tests.security.progress_tools"])
    attacker = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
    run_id = f"spoof-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/write"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="write", tool="two_gates")])
    async with opened_ledger(settings) as ledger, build_worker(client, ledger, registry, settings, identity="worker-p"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        try:

            async def live_in_preflight() -> None:
                status, attributes, _ = await shown(handle)
                [view] = status["tasks"]
                assert (view["stage"], view["claim_generation"], view["lease_owner"]) == ("preflight", 1, "worker-p")
                assert attributes[sa.CURRENT_OWNER.name] == "worker-p", attributes

            await assert_eventually(live_in_preflight, timeout=40, message="the run shows the live lease")

            target = attacker.get_workflow_handle(run_id)
            await target.signal(LEASE_PROGRESS_SIGNAL, SPOOF)  # no proof at all
            await target.signal(LEASE_PROGRESS_SIGNAL, {**SPOOF, "proof": "0" * 64})  # a made-up one
            await target.signal(LEASE_PROGRESS_SIGNAL, {**SPOOF, "step_id": "nope"})  # a step the run lacks

            # A query after a signal is answered once the signal's workflow task completed.
            status, attributes, details = await shown(handle)
            assert_not_spoofed(status, attributes, details)
            assert status.get("refused_progress") == 3, status
            assert "3 lease progress signals refused" in details, details

            # The genuine attempt's next stage is still shown (the spoof did not raise the generation).
            gate(f"{task_id}#1").set()

            async def genuine_next_stage() -> None:
                status, attributes, details = await shown(handle)
                [view] = status["tasks"]
                assert (view["stage"], view["progress"]) == ("external_call", "past the first gate"), view
                assert attributes[sa.CURRENT_STAGE.name] == "external_call", attributes
                assert_not_spoofed(status, attributes, details)

            await assert_eventually(genuine_next_stage, timeout=40, message="genuine progress after the spoof")
        finally:
            gate(f"{task_id}#1").set()
            gate(f"{task_id}#2").set()
        result = await handle.result()
    assert [t.status.value for t in result.tasks] == ["settled"]
    assert result.refused_progress == 3
    replayed = await replayer().replay_workflow(await handle.fetch_history(), raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_with_the_codec_the_run_secret_and_the_call_key_are_sealed_in_history(
    settings: AgentLeaseSettings, temporal_address: str
) -> None:
    """A peer who reads the run's history without the codec's keys cannot prove progress."""
    settings = settings.model_copy(update={"codec_keys": "k1:" + base64.b64encode(b"2" * 32).decode()})
    client = await connect(settings)
    registry = load_registry(["tests.security.progress_tools"])
    run_id = f"sealed-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/write"
    gate(f"{task_id}#1").set()
    gate(f"{task_id}#2").set()
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="write", tool="two_gates")])
    async with opened_ledger(settings) as ledger, build_worker(client, ledger, registry, settings):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        result = await handle.result()
    assert [t.status.value for t in result.tasks] == ["settled"]
    key = KEYS[task_id]
    assert key is not None and len(key) == 64
    reader = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
    raw = await reader.get_workflow_handle(run_id).fetch_history()
    assert key not in raw.to_json()
    minted = [
        event.marker_recorded_event_attributes.details["result"].payloads[0]
        for event in raw.events
        if event.marker_recorded_event_attributes.marker_name == "core_local_activity"
        # the run learns its catalog and its progress secret from one local activity
        and DESCRIBE_RUN.encode() in event.marker_recorded_event_attributes.details["data"].payloads[0].data
    ]
    assert len(minted) == 1 and minted[0].metadata["encoding"] == ENCODING, minted
