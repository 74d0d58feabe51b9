"""The ledger counts what it writes (agentlease.observability.metrics), on SQLite and PostgreSQL.

Each test uses a tool name of its own, so the label sets it reads are its alone; values are read
from the process's Prometheus registry as deltas.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from agentlease.enums import Stage, TaskStatus
from agentlease.errors import LeaseHeldError, LeaseLostError, TaskClosedError
from agentlease.ledger.expiry import expired_leases, record_expiry
from agentlease.ledger.store import Ledger
from agentlease.records import TaskSpec, TraceLink
from tests.integration.test_ledger_guards import TTL, make_receipt, make_spec


def value(name: str, **labels: str) -> float:
    """A sample of an unscoped ledger's metrics (empty namespace and task queue labels)."""
    return REGISTRY.get_sample_value(name, {"namespace": "", "task_queue": "", **labels}) or 0.0


def own_tool(spec: TaskSpec) -> TaskSpec:
    return spec.model_copy(update={"tool": f"metrics_{uuid.uuid4().hex[:8]}"})


async def test_claims_renewals_and_settles_are_counted(ledger: Ledger) -> None:
    spec = own_tool(make_spec())
    tool = spec.tool
    base = await ledger.db_now()
    trace = TraceLink(workflow_id="wf", run_id="r", activity_id="1", attempt=1)
    claim = await ledger.claim(spec, "w1", trace=trace, now=base)
    with pytest.raises(LeaseHeldError):
        await ledger.claim(spec, "w2", now=base + timedelta(seconds=1))
    for second, stage in enumerate((Stage.PREFLIGHT, Stage.EXTERNAL_CALL, Stage.COMMIT), start=2):
        await ledger.renew(claim, reason=stage.value, stage=stage, now=base + timedelta(seconds=second))
    await ledger.settle(claim, make_receipt("doc", base), now=base + timedelta(seconds=5))
    with pytest.raises(TaskClosedError):
        await ledger.claim(spec, "w3", now=base + timedelta(seconds=6))

    assert value("agentlease_lease_claims_total", tool=tool, outcome="granted") == 1
    assert value("agentlease_lease_claims_total", tool=tool, outcome="held") == 1
    assert value("agentlease_lease_claims_total", tool=tool, outcome="closed") == 1
    assert value("agentlease_lease_acquisition_seconds_count", tool=tool) == 1
    assert value("agentlease_claims_without_trace_total", tool=tool) == 0
    for label in ("preflight", "external_call", "commit"):
        assert value("agentlease_lease_renewals_total", tool=tool, stage=label, outcome="renewed") == 1
    assert value("agentlease_settlements_total", tool=tool, outcome="settled") == 1
    assert value("agentlease_lease_renewals_per_task_count", tool=tool) == 1
    assert value("agentlease_lease_renewals_per_task_sum", tool=tool) == 3


async def test_lost_leases_late_results_and_expiry_by_stage_are_counted(ledger: Ledger) -> None:
    spec = own_tool(make_spec())
    tool = spec.tool
    base = await ledger.db_now()
    old = await ledger.claim(spec, "w1", now=base)  # no trace link
    await ledger.renew(old, reason="writing", stage=Stage.COMMIT, now=base + timedelta(seconds=1))
    takeover = base + timedelta(seconds=1) + TTL + timedelta(milliseconds=5)
    await ledger.claim(spec, "w2", now=takeover)
    with pytest.raises(LeaseLostError):
        await ledger.renew(old, reason="late", stage=Stage.VERIFY, now=takeover)
    with pytest.raises(LeaseLostError):
        await ledger.settle(old, make_receipt("late", takeover), now=takeover)

    assert value("agentlease_claims_without_trace_total", tool=tool) == 2
    assert value("agentlease_leases_expired_total", tool=tool, stage="commit", by="takeover") == 1
    assert value("agentlease_lease_renewals_total", tool=tool, stage="verify", outcome="lost") == 1
    assert value("agentlease_settlements_total", tool=tool, outcome="late_unapplied") == 1
    assert value("agentlease_settlements_total", tool=tool, outcome="settled") == 0


async def test_releases_by_error_class_parking_and_sweeper_expiry_are_counted(ledger: Ledger) -> None:
    retried, parked, swept = (own_tool(make_spec(step)) for step in ("retried", "parked", "swept"))
    base = await ledger.db_now()
    claim = await ledger.claim(retried, "w1", now=base)
    await ledger.release(claim, error_class="retryable", error="503", now=base)
    claim = await ledger.claim(retried, "w1", now=base)
    await ledger.release(claim, error_class="shutdown", error="SIGTERM", now=base)
    claim = await ledger.claim(parked, "w1", now=base)
    await ledger.dead_letter(claim, error_class="permanent", error="400", now=base)
    claim = await ledger.claim(swept, "w1", now=base)
    await ledger.renew(claim, reason="sending", stage=Stage.EXTERNAL_CALL, now=base)
    later = base + TTL + timedelta(seconds=1)
    [lease] = [lease for lease in await expired_leases(ledger, limit=100, now=later) if lease.task_id == swept.task_id]
    assert await record_expiry(ledger, lease, status=TaskStatus.NEEDS_RECONCILIATION, decision="test", now=later)

    assert value("agentlease_lease_releases_total", tool=retried.tool, error_class="retryable") == 1
    assert value("agentlease_lease_releases_total", tool=retried.tool, error_class="shutdown") == 1
    assert value("agentlease_tasks_parked_total", tool=parked.tool, status="dead_lettered") == 1
    assert value("agentlease_leases_expired_total", tool=swept.tool, stage="external_call", by="sweeper") == 1
    assert value("agentlease_tasks_parked_total", tool=swept.tool, status="needs_reconciliation") == 1
