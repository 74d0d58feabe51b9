"""Retention (finding 7): ``agentlease purge`` deletes the evidence of final tasks by age, in batches,
on SQLite and PostgreSQL, with a dry run and counts; open tasks, and receipts when told, are kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentlease.enums import DecisionKind, SideEffectClass
from agentlease.ledger.store import Ledger
from agentlease.records import SettlementReceipt, TaskSpec
from tests.security.edge_cli import agentlease

OLD = datetime.now(UTC) - timedelta(days=40)


def _spec(task: str, run: str = "ret") -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{task}",
        agent_run_id=run,
        step_id=task,
        tool="t",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=f"{run}:{task}",
        lease_ttl=timedelta(seconds=30),
    )


def _receipt(task: str) -> SettlementReceipt:
    return SettlementReceipt(external_system="x", external_id=task, status="ok", verified_at=datetime.now(UTC))


async def _settled(ledger: Ledger, task: str, at: datetime | None) -> None:
    claim = await ledger.claim(_spec(task), "w", now=at)
    await ledger.renew(claim, reason="working", now=at)
    await ledger.settle(claim, _receipt(task), now=at)


async def _fill(ledger: Ledger) -> None:
    for n in range(5):
        await _settled(ledger, f"old-{n}", OLD)
    await _settled(ledger, "recent", None)
    # Its lease lapsed long ago: not final, never purged. (In a run of its own: a run still open keeps
    # its receipts, tests/security/test_round2_peers.py.)
    await ledger.claim(_spec("old-open", run="ret-open"), "w", now=OLD)
    await ledger.decide(
        "ret/old-rejected", DecisionKind.AWAIT_APPROVAL, by="run", reason="gate", spec=_spec("old-rejected"), now=OLD
    )
    await ledger.decide("ret/old-rejected", DecisionKind.REJECT, by="ops", reason="no", now=OLD)


async def test_purge_deletes_old_final_tasks_in_batches(ledger: Ledger) -> None:
    from agentlease.ledger.retention import purge

    await _fill(ledger)
    before = len(await ledger.events(agent_run_id="ret"))
    old_ids = [f"ret/old-{n}" for n in range(5)] + ["ret/old-rejected"]
    old_events = sum([len(await ledger.events(t)) for t in old_ids])

    dry = await purge(ledger, timedelta(days=30), dry_run=True)
    assert (dry.tasks, dry.events, dry.receipts, dry.batches) == (6, old_events, 5, 0)
    assert len(await ledger.events(agent_run_id="ret")) == before  # a dry run deletes nothing

    done = await purge(ledger, timedelta(days=30), batch_size=2)
    assert (done.tasks, done.events, done.receipts, done.batches) == (6, old_events, 5, 3)
    left = sorted(t.task_id for t in await ledger.list_tasks())
    assert left == ["ret-open/old-open", "ret/recent"]
    assert await ledger.receipt("ret:recent") is not None
    assert await ledger.receipt("ret:old-0") is None
    assert len(await ledger.events(agent_run_id="ret")) == before - old_events
    again = await purge(ledger, timedelta(days=30))
    assert (again.tasks, again.events, again.receipts) == (0, 0, 0)


async def test_purge_can_keep_receipts(ledger: Ledger) -> None:
    from agentlease.ledger.retention import purge

    await _fill(ledger)
    done = await purge(ledger, timedelta(days=30), keep_receipts=True)
    assert (done.tasks, done.receipts) == (6, 0)
    kept = await ledger.receipt("ret:old-3")
    assert kept is not None and kept.receipt.external_id == "old-3"  # the key still answers
    assert not await ledger.events("ret/old-3")


async def test_purge_command(ledger: Ledger, ledger_url: str) -> None:
    await _fill(ledger)
    env = {"AGENTLEASE_LEDGER_URL": ledger_url}
    dry = await agentlease("purge", "--older-than", "30d", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would delete 6 tasks, ") and "5 receipts" in dry.stdout, dry.stdout
    kept = await agentlease("purge", "--older-than", "30d", "--keep-receipts", "--batch-size", "4", env=env)
    assert kept.returncode == 0, kept.stderr
    assert "deleted 6 tasks" in kept.stdout and "0 receipts (receipts kept) in 2 batches" in kept.stdout, kept.stdout
    for bad in (["--older-than", "30x"], ["--older-than", "0d"], ["--older-than", "30d", "--batch-size", "0"]):
        refused = await agentlease("purge", *bad, env=env)
        assert refused.returncode == 2, refused
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr, refused.stderr
