"""A step id with ``/`` does not let a workflow reach the tasks of a run whose workflow id begins with
its own id and a ``/`` (found by an attack; each test failed before the fix).

The binding check (``tools/_binding.task_refusal``) requires ``task_id == task_id_for(workflow id, step
id)``, ``agent_run_id == workflow id`` and, since, that the step id is a step id. Before, the inputs of
the decision activity and the leased activities (``TaskSpec.step_id``, ``ToolCall.step_id``) and of
``agentlease.record_unknown_tools`` (``UnknownToolStep.step_id``) took any string. A workflow ``tenant``
that names step ``42/mail`` derives task ``tenant/42/mail``, which is step ``mail`` of the run
``tenant/42``. Plan runs refuse ``/`` in their id (``check_run_id``), but a workflow of one's own or an
adapter's agent (``leased_calls().call``) takes any workflow id.

What each attack did before the fix, on the real dev server (authenticated decision mode, no key):

- ``agentlease.apply_decision`` with ``run_own=True`` (a "run's own" cancel needs no signature) cancels the
  victim's task, which was waiting for an operator's approval;
- ``agentlease.record_unknown_tools`` marks the victim's released task ``cancelled`` (``unknown_tool``);
- a leased tool activity (``quick``) claims the victim's released task (generation 2) and settles it with
  the attacker's call: the victim's own retry then finds it settled by another workflow.

Expected: all refused (the step id is not a step id of the scheduling workflow), the victim's task unchanged.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.service import RPCError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from agentlease.decisions.table import LedgerDecision
from agentlease.enums import DecisionKind, SideEffectClass, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.plugin import AgentLeasePlugin
from agentlease.records import TaskSpec, idempotency_key_for, task_id_for
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._calls import leased_calls
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import REGISTRY, opened_ledger
from tests.security.attacker import AttackerDecision

pytestmark = pytest.mark.timeout(120)


@workflow.defn(name="AttackSlashVictim")
class SlashVictim:
    """A workflow of its own (as an adapter's agent is) making one leased call that needs approval."""

    @workflow.run
    async def run(self) -> str:
        outcome = await leased_calls().call("send_once", {"hold_first_attempt": False}, step_id="mail")
        return str(outcome.view.status)


@workflow.defn(name="AttackerUnknownTools")
class AttackerUnknownTools:
    @workflow.run
    async def run(self, queue: str, record: dict[str, Any]) -> None:
        await workflow.execute_activity(
            "agentlease.record_unknown_tools",
            record,
            task_queue=queue,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=2),
        )


def _public() -> str:
    raw = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return base64.b64encode(raw).decode()


@asynccontextmanager
async def _deployment(client: Client, settings: AgentLeaseSettings) -> AsyncIterator[Ledger]:
    """The deployment's worker (authenticated mode, serving the victim's workflow) and the attacker's."""
    settings = settings.model_copy(update={"decision_mode": "authenticated", "operator_keys": f"alice={_public()}"})
    own = await Client.connect(
        client.service_client.config.target_host,
        data_converter=pydantic_data_converter,
        runtime=Runtime(telemetry=TelemetryConfig()),
        identity="victim-worker",
    )
    async with opened_ledger(settings) as ledger:
        plugin = AgentLeasePlugin(
            settings=settings,
            ledger=ledger,
            tools=REGISTRY,
            identity="victim-worker",
            builtins=True,
            agent_run_workflow=True,
        )
        async with (
            Worker(
                own,
                task_queue=settings.task_queue,
                workflows=[SlashVictim],
                plugins=[plugin],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ),
            Worker(
                client,
                task_queue=settings.task_queue + "-attacker",
                workflows=[AttackerDecision, AttackerUnknownTools],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ),
        ):
            yield ledger


async def test_a_run_own_cancel_with_a_slash_step_id_cannot_cancel_another_runs_task(
    client: Client, settings: AgentLeaseSettings
) -> None:
    prefix = f"tenant-{uuid.uuid4().hex[:8]}"
    victim = f"{prefix}/42"
    victim_task = task_id_for(victim, "mail")
    async with _deployment(client, settings) as ledger:
        handle = await client.start_workflow(SlashVictim.run, id=victim, task_queue=settings.task_queue)
        try:

            async def parked() -> None:
                tasks = {t.task_id: t.status for t in await ledger.list_tasks(victim)}
                assert tasks.get(victim_task) is TaskStatus.AWAITING_APPROVAL, tasks

            await assert_eventually(parked, timeout=30, message="the victim's call waits for approval")

            # The attacker's workflow is named like the victim's id up to its '/'; it names step "42/mail".
            step = victim_task.removeprefix(f"{prefix}/")
            forged = TaskSpec(
                task_id=task_id_for(prefix, step),
                agent_run_id=prefix,
                step_id=step,
                tool="send_once",
                side_effect_class=SideEffectClass.UNSAFE,
                idempotency_key=idempotency_key_for(prefix, step),
                lease_ttl=timedelta(seconds=5),
            )
            assert forged.task_id == victim_task
            decision = LedgerDecision(
                kind=DecisionKind.CANCEL, task=forged, by="agentlease", reason="no key needed", run_own=True
            )
            with suppress(WorkflowFailureError):  # expected: refused
                await client.execute_workflow(
                    AttackerDecision.run,
                    args=[settings.task_queue, decision.model_dump(mode="json")],
                    id=prefix,
                    task_queue=settings.task_queue + "-attacker",
                )
            after = await ledger.get_task(victim_task)
            assert after.status is TaskStatus.AWAITING_APPROVAL, (after.status, after.last_error)
        finally:
            with suppress(RPCError):
                await handle.terminate("test over")


async def test_record_unknown_tools_with_a_slash_step_id_cannot_cancel_another_runs_task(
    client: Client, settings: AgentLeaseSettings
) -> None:
    prefix = f"tenant-{uuid.uuid4().hex[:8]}"
    victim = f"{prefix}/42"
    async with _deployment(client, settings) as ledger:
        # The victim's task as its worker leaves it between two attempts: released (a retryable failure).
        spec = TaskSpec(
            task_id=task_id_for(victim, "fetch"),
            agent_run_id=victim,
            step_id="fetch",
            tool="quick",
            side_effect_class=SideEffectClass.READ_ONLY,
            idempotency_key=idempotency_key_for(victim, "fetch"),
            lease_ttl=timedelta(seconds=5),
        )
        claim = await ledger.claim(spec, owner="victim-worker")
        await ledger.release(claim, error_class="retryable", error="503 from upstream")
        assert (await ledger.get_task(spec.task_id)).status is TaskStatus.RELEASED

        record = {"steps": [{"step_id": "42/fetch", "tool": "quick"}], "known": []}
        with suppress(WorkflowFailureError):  # expected: refused
            await client.execute_workflow(
                AttackerUnknownTools.run,
                args=[settings.task_queue, record],
                id=prefix,
                task_queue=settings.task_queue + "-attacker",
            )
        after = await ledger.get_task(spec.task_id)
        assert after.status is TaskStatus.RELEASED, (after.status, after.error_class, after.last_error)


async def test_a_leased_call_with_a_slash_step_id_cannot_claim_or_settle_another_runs_task(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """The same step id trick on a leased tool activity: the attacker's workflow claims and settles the
    victim's released task (between two attempts) with its own call; the victim's retry then finds it settled."""
    from agentlease.records import ToolCall
    from tests.security.attacker import AttackerToolCall

    prefix = f"tenant-{uuid.uuid4().hex[:8]}"
    victim = f"{prefix}/42"
    spec = TaskSpec(
        task_id=task_id_for(victim, "fetch"),
        agent_run_id=victim,
        step_id="fetch",
        tool="quick",
        side_effect_class=SideEffectClass.READ_ONLY,
        idempotency_key=idempotency_key_for(victim, "fetch"),
        lease_ttl=timedelta(seconds=5),
    )
    async with _deployment(client, settings) as ledger:
        claim = await ledger.claim(spec, owner="victim-worker")
        await ledger.release(claim, error_class="retryable", error="503 from upstream")
        step = "42/fetch"
        forged = ToolCall(
            task_id=task_id_for(prefix, step),
            agent_run_id=prefix,
            step_id=step,
            tool="quick",
            arguments={},
            idempotency_key=idempotency_key_for(prefix, step),
        )
        assert forged.task_id == spec.task_id
        async with Worker(
            client,
            task_queue=settings.task_queue + "-attacker-2",
            workflows=[AttackerToolCall],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            with suppress(WorkflowFailureError):  # expected: refused
                await client.execute_workflow(
                    AttackerToolCall.run,
                    args=[settings.task_queue, "quick", forged.model_dump(mode="json"), 5.0],
                    id=prefix,
                    task_queue=settings.task_queue + "-attacker-2",
                )
        after = await ledger.get_task(spec.task_id)
        assert (after.status, after.claim_generation) == (TaskStatus.RELEASED, 1), (
            after.status,
            after.claim_generation,
            after.trace,
        )
