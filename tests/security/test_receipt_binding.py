"""Finding 1: a step cannot settle with another run's receipt without running.

Through the public API (``AgentRunWorkflow`` plans on the real dev server): run A sends a mail with
the caller-chosen key ``K``; run B, a ``noop`` step with the same key, used to settle at once with A's
receipt. Now a caller's key is scoped to its run (B runs its own ``noop``), and a key deliberately
shared across runs settles only the same tool with the same arguments: anything else is refused,
dead-lettered with the reason in the trail (like Stripe's 422).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from temporalio.client import Client

from agentlease.enums import EventKind, SideEffectClass, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, RunStatus, SettlementReceipt, TaskSpec
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.security import tools
from tests.security.conftest import victim_worker


async def _run(
    client: Client, attack_settings: AgentLeaseSettings, run_id: str, step: PlanStep, *, ends: bool = True
) -> RunStatus:
    """Run a one-step plan until it ends or (``ends=False``) its step waits for a person."""
    handle = await client.start_workflow(
        AgentRunWorkflow.run,
        AgentRunPlan(agent_run_id=run_id, steps=[step]),
        id=run_id,
        task_queue=attack_settings.task_queue,
    )
    if ends:
        return await asyncio.wait_for(handle.result(), timeout=90)

    async def waiting() -> RunStatus:
        status = await handle.query("status", result_type=RunStatus)
        assert status.tasks and status.tasks[0].status == "dead_lettered", status
        return status

    status = await assert_eventually(waiting, timeout=90, message=f"{run_id} dead-lettered")
    await handle.terminate("test over")
    return status


async def test_another_runs_key_does_not_settle_a_step_without_running(
    client: Client, attack_settings: AgentLeaseSettings
) -> None:
    ledger = Ledger.from_url(attack_settings.ledger_url)
    await upgrade(ledger.database)
    victim, attacker = f"victim-{uuid.uuid4().hex[:8]}", f"attacker-{uuid.uuid4().hex[:8]}"
    try:
        async with victim_worker(client, ledger, attack_settings):
            mail = PlanStep(step_id="mail", tool="send_mail", arguments={"to": "cfo@example.com"}, idempotency_key="K")
            sent = await _run(client, attack_settings, victim, mail)
            skip = PlanStep(step_id="skip", tool="noop", idempotency_key="K")
            skipped = await _run(client, attack_settings, attacker, skip)
        [victim_view], [attacker_view] = sent.tasks, skipped.tasks
        assert victim_view.status == "settled" and victim_view.receipt is not None
        # B ran its own noop under its own run's key: A's receipt did not settle it.
        assert attacker_view.status == "settled", attacker_view
        assert attacker_view.receipt is not None and attacker_view.receipt.external_system == "noop", attacker_view
        assert attacker_view.idempotency_key != victim_view.idempotency_key
        assert (await ledger.get_task(f"{attacker}/skip")).idempotency_key == f"{attacker}:K"
    finally:
        await ledger.close()


async def test_a_shared_key_reused_for_another_action_is_refused_and_recorded(
    client: Client, attack_settings: AgentLeaseSettings
) -> None:
    ledger = Ledger.from_url(attack_settings.ledger_url)
    await upgrade(ledger.database)
    first, other_tool, other_args, same = (f"run-{n}-{uuid.uuid4().hex[:8]}" for n in range(4))
    mail = {"to": "cfo@example.com"}
    try:
        async with victim_worker(client, ledger, attack_settings):
            shared = {"idempotency_key": "invoice-42", "share_idempotency_key": True}
            sent = await _run(
                client, attack_settings, first, PlanStep(step_id="mail", tool="send_mail", arguments=mail, **shared)
            )
            noop = await _run(
                client, attack_settings, other_tool, PlanStep(step_id="skip", tool="noop", **shared), ends=False
            )
            elsewhere = {"to": "attacker@example.net"}
            moved = await _run(
                client,
                attack_settings,
                other_args,
                PlanStep(step_id="mail", tool="send_mail", arguments=elsewhere, **shared),
                ends=False,
            )
            again = await _run(
                client, attack_settings, same, PlanStep(step_id="mail", tool="send_mail", arguments=mail, **shared)
            )
        assert sent.tasks[0].status == "settled"
        for run_id, status in ((other_tool, noop), (other_args, moved)):
            [view] = status.tasks
            assert view.status == "dead_lettered", view
            assert "already has a settlement receipt" in (view.error or ""), view
            task = await ledger.get_task(f"{run_id}/{view.step_id}")
            assert task.status is TaskStatus.DEAD_LETTERED and task.receipt is None
            [dead] = [e for e in await ledger.events(task.task_id) if e.kind is EventKind.DEAD_LETTERED]
            assert "reused for another action" in (dead.reason or ""), dead
        # The same action shared on purpose settles from the first receipt, without sending again.
        assert again.tasks[0].status == "settled" and again.tasks[0].receipt == sent.tasks[0].receipt
        ours = {f"{run_id}/mail" for run_id in (first, other_args, same)}
        assert [(m["task_id"], m["to"]) for m in tools.SENT if m["task_id"] in ours] == [
            (f"{first}/mail", "cfo@example.com")
        ]
    finally:
        await ledger.close()


async def test_the_ledger_gives_a_claim_only_the_receipt_of_its_own_action(ledger: Ledger) -> None:
    """The ledger API: a receipt stored for a key does not reach a task of another tool or arguments."""
    from agentlease.records import arguments_fingerprint, scoped_idempotency_key

    key = scoped_idempotency_key("-", "shared-key", shared=True)

    def spec(run: str, tool: str, arguments: dict) -> TaskSpec:
        return TaskSpec(
            task_id=f"{run}/s",
            agent_run_id=run,
            step_id="s",
            tool=tool,
            side_effect_class=SideEffectClass.IDEMPOTENT,
            idempotency_key=key,
            lease_ttl=timedelta(minutes=1),
            arguments_sha256=arguments_fingerprint(arguments),
        )

    first = await ledger.claim(spec("a", "send_mail", {"to": "x"}), "w")
    receipt = SettlementReceipt(external_system="mail", external_id="m1", status="sent", verified_at=datetime.now(UTC))
    await ledger.settle(first, receipt)
    for other in (spec("b", "noop", {}), spec("c", "send_mail", {"to": "y"})):
        claim = await ledger.claim(other, "w")
        assert claim.receipt is None and "reused for another action" in (claim.receipt_refused or ""), claim
    same = await ledger.claim(spec("d", "send_mail", {"to": "x"}), "w")
    assert same.receipt is not None and same.receipt.receipt == receipt and same.receipt_refused is None
