"""Idempotency keys that cannot collide, on the real dev server (``docs/security.md``, "Idempotency keys"):
a run whose action key names another run's step, the same action asked with a defaulted argument left out or
``100.0`` for ``100``, and an action key too long for the wire. One worker in this process per test."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from agentlease.enums import RunState, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.limits import is_wire_key
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.runtime.temporal import connect
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.integration import keyed_tools
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(240)


def step(step_id: str, tool: str, **arguments: Any) -> PlanStep:
    return PlanStep(step_id=step_id, tool=tool, arguments=arguments)


async def run_plans(settings: AgentLeaseSettings, *plans: AgentRunPlan) -> tuple[Ledger, list[RunStatus]]:
    """Run ``plans`` one after another on one worker; the ledger (closed) and each run's final status."""
    configured = settings.model_copy(update={"tool_modules": ["tests.integration.keyed_tools"]})
    done: list[RunStatus] = []
    async with opened_ledger(configured) as ledger:
        client = await connect(configured)
        async with build_worker(client, ledger, load_registry(configured.tool_modules), configured):
            for plan in plans:
                run_id, queue = plan.agent_run_id or "", configured.task_queue
                done.append(await client.execute_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=queue))
    return ledger, done


async def test_a_run_cannot_key_its_action_as_another_runs_step(settings: AgentLeaseSettings) -> None:
    """Run ``acme`` keys an action ``42:refund``; run ``acme:42`` has a step ``refund``. Each runs its own tool
    once (the second used to settle from, or be dead-lettered by, the first's receipt of ``acme:42:refund``)."""
    acme = f"acme-{uuid.uuid4().hex[:8]}"
    victim = f"{acme}:42"
    attacker_plan = AgentRunPlan(
        agent_run_id=acme, steps=[step("write", "keyed_write", run=acme, ref="42:refund", amount=1)]
    )
    victim_plan = AgentRunPlan(
        agent_run_id=victim, steps=[step("refund", "plain_write", run=victim, ref="42:refund", amount=1)]
    )
    _, (attacker, own) = await run_plans(settings, attacker_plan, victim_plan)

    assert (attacker.status, own.status) == (RunState.COMPLETED, RunState.COMPLETED), (attacker, own)
    assert [(v.status, v.idempotency_key, v.settled_by) for v in attacker.tasks] == [
        (TaskStatus.SETTLED, f"{acme}:42%3Arefund", None)
    ]
    assert [(v.status, v.idempotency_key, v.settled_by) for v in own.tasks] == [
        (TaskStatus.SETTLED, f"{acme}%3A42:refund", None)
    ]
    assert keyed_tools.WRITES[acme] == ["42:refund"] and keyed_tools.WRITES[victim] == ["42:refund"]


async def test_the_same_action_asked_again_settles_from_its_receipt(settings: AgentLeaseSettings) -> None:
    """A defaulted argument left out, or ``100.0`` for ``100``: the same action, settled without running again
    (it used to be dead-lettered as a key reused for another action)."""
    run_id = f"same-{uuid.uuid4().hex[:8]}"
    plan = AgentRunPlan(
        agent_run_id=run_id,
        steps=[
            step("first", "keyed_write", run=run_id, ref="r-1", amount=100, note=""),
            step("no-note", "keyed_write", run=run_id, ref="r-1", amount=100),
            step("float", "keyed_write", run=run_id, ref="r-1", amount=100.0),
        ],
    )
    _, (status,) = await run_plans(settings, plan)

    assert status.status is RunState.COMPLETED, status
    assert [(v.status, v.settled_by) for v in status.tasks] == [
        (TaskStatus.SETTLED, None),
        (TaskStatus.SETTLED, "earlier_receipt"),
        (TaskStatus.SETTLED, "earlier_receipt"),
    ]
    assert keyed_tools.WRITES[run_id] == ["r-1"]


async def test_a_long_or_unicode_action_key_is_digested_not_a_failed_run(settings: AgentLeaseSettings) -> None:
    """An action key over 255 characters, and a Unicode run id with a Unicode action key: the steps run, under
    keys the downstream convention accepts (the first used to fail the run and skip the later steps)."""
    long_run = f"long-{uuid.uuid4().hex[:8]}"
    unicode_run = f"ünï-{uuid.uuid4().hex[:8]}"
    long_plan = AgentRunPlan(
        agent_run_id=long_run,
        steps=[
            step("long", "keyed_write", run=long_run, ref="x" * 300, amount=1),
            step("later", "plain_write", run=long_run, ref="later", amount=1),
        ],
    )
    unicode_plan = AgentRunPlan(
        agent_run_id=unicode_run, steps=[step("write", "keyed_write", run=unicode_run, ref="rückerstattung", amount=1)]
    )
    _, statuses = await run_plans(settings, long_plan, unicode_plan)

    for status in statuses:
        assert status.status is RunState.COMPLETED, status
        assert {v.status for v in status.tasks} == {TaskStatus.SETTLED}, status
        assert all(is_wire_key(v.idempotency_key) for v in status.tasks), status
    assert keyed_tools.WRITES[long_run] == ["x" * 300, "later"]
    assert keyed_tools.WRITES[unicode_run] == ["rückerstattung"]
