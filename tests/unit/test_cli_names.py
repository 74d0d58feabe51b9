"""One set of names: each listing's column headers are keys of the same listing's JSON, all from NAMES."""

from __future__ import annotations

from agentlease.cli.render import EVENT_COLUMNS, NAMES, TASK_COLUMNS, plain
from agentlease.records import LeaseEvent, TaskRecord

TRACE = {
    "trace_workflow_id": "wf",
    "trace_run_id": "r",
    "trace_activity_id": "1",
    "trace_attempt": 1,
    "trace_id": "0" * 31 + "1",
}

TASK_ROW = {
    "task_id": "run/step",
    "agent_run_id": "run",
    "step_id": "step",
    "tool": "quick",
    "side_effect_class": "read_only",
    "status": "running",
    "stage": "preflight",
    "lease_owner": "w1",
    "lease_acquired_at_ms": 1_700_000_000_000,
    "lease_expires_at_ms": 1_700_000_005_000,
    "lease_ttl_ms": 5000,
    "claim_generation": 1,
    "attempts": 1,
    "renewal_count": 0,
    "idempotency_key": "run:step",
    "receipt": None,
    "last_error": None,
    "error_class": None,
    "created_at_ms": 1_700_000_000_000,
    "updated_at_ms": 1_700_000_000_000,
    **TRACE,
}

EVENT_ROW = {
    "event_id": 1,
    "task_id": "run/step",
    "kind": "claimed",
    "claim_generation": 1,
    "lease_owner": "w1",
    "stage": None,
    "reason": "attempt 1",
    "details": {"by": "takeover"},
    "at_ms": 1_700_000_000_000,
    **TRACE,
}


def test_every_column_is_a_name_and_a_json_key_of_its_listing() -> None:
    task = plain(TaskRecord.from_row(TASK_ROW))
    event = plain(LeaseEvent.from_row(EVENT_ROW))
    for columns, record in ((TASK_COLUMNS, task), (EVENT_COLUMNS, event)):
        assert set(columns) <= set(NAMES), set(columns) - set(NAMES)
        assert set(columns) <= set(record), set(columns) - set(record)
    assert task["trace_id"] == event["trace_id"] == TRACE["trace_id"]
