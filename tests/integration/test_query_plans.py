"""Every ledger statement reads through an index on a large ledger: no scan of tasks, lease_events or receipts.

The ledger is filled in bulk (:mod:`bench.fill`: ``AGENTLEASE_PLAN_ROWS`` tasks, default 50,000,
with two evidence entries each, then ``ANALYZE``), so the planner decides with the statistics of
a ledger that has been used for a while. Each statement of :func:`lease_statements`, each
statement of each lease write of :func:`lease_writes` (as both dialects run it, and PostgreSQL's
one statement) and each operator listing of :mod:`agentlease.ledger.statements` is explained with real parameters
(``EXPLAIN`` on PostgreSQL, ``EXPLAIN QUERY PLAN`` on SQLite); the plan must not scan a table
whole. The keyset pages must also read their own index in order (a page of one run's trail must
not walk the whole trail in ``event_id`` order and filter).
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import literal
from sqlalchemy.engine import Connection
from sqlalchemy.sql import visitors
from sqlalchemy.types import NullType

from agentlease.clock import now_param
from agentlease.enums import DecisionKind, TaskStatus
from agentlease.ledger.expiry import batch_params, record_statement
from agentlease.ledger.rendering import Rendered, event_params
from agentlease.ledger.statements import (
    TaskFilter,
    events_page,
    held,
    lease_statements,
    run_exists,
    runs_page,
    tasks_page,
)
from agentlease.ledger.store import Ledger
from agentlease.ledger.writes import lease_writes
from agentlease.records import TraceLink
from bench.fill import Fill, fill_ledger

ROWS = int(float(os.environ.get("AGENTLEASE_PLAN_ROWS", "50000")))
TASK = "fill-5/s3"
RUN = "fill-5"
TABLES = ("tasks", "lease_events", "receipts")


def plan(conn: Connection, statement: Any, params: dict[str, Any]) -> str:
    """The plan of ``statement`` with ``params``, rendered as literals (JSON objects as JSON text)."""
    plain = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in params.items()}

    def bind(parameter: Any) -> None:
        if parameter.key in plain:
            parameter.value, parameter.required = plain[parameter.key], False
            if isinstance(parameter.type, NullType) or isinstance(params[parameter.key], dict):
                parameter.type = literal(parameter.value).type

    bound = visitors.cloned_traverse(statement, {}, {"bindparam": bind})
    sql = bound.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
    explain = "EXPLAIN " if conn.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN "
    rows = conn.exec_driver_sql(explain + str(sql).replace("%", "%%")).all()
    return "\n".join(str(row[-1]) for row in rows)


def full_scans(dialect: str, text: str) -> list[str]:
    """The lines of a plan that read one of the ledger's tables whole."""
    if dialect == "postgresql":
        pattern = re.compile(rf"Seq Scan on ({'|'.join(TABLES)})\b")
    else:  # SQLite: "SCAN tasks" without an index (a "SCAN ... USING INDEX" walks an index in order)
        pattern = re.compile(rf"\bSCAN ({'|'.join(TABLES)})\b(?! USING)")
    return [line for line in text.splitlines() if pattern.search(line)]


def statements_to_explain(dialect: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    sql = lease_statements(dialect)
    now = now_param(datetime.now(UTC))
    holder = {**held(TASK, "fill-worker", 1), **now}
    trace = TraceLink(workflow_id="w", run_id="r", activity_id="1", attempt=1)
    task_values = {
        "task_id": "new/s",
        "agent_run_id": "new",
        "step_id": "s",
        "tool": "t",
        "side_effect_class": "idempotent",
        "lease_ttl_ms": 30_000,
        "idempotency_key": "new:s",
        "lease_owner": "w",
        **trace.columns(),
        **now,
    }
    receipt = {"external_system": "x", "external_id": "1", "status": "ok", "details": {}, "verified_at": "2026"}
    gate = {"claim_needs_approval": True, "claim_tool": "t", "claim_arguments_sha256": "0" * 64}
    gate["claim_approval_ttl_ms"] = 3_600_000
    ttl = {"lease_ttl_override_ms": 3_000}
    event = event_params("x", {}, trace)
    statements: dict[str, tuple[Any, dict[str, Any]]] = {
        "insert_task": (sql.insert_task, task_values),
        "current_task": (sql.current_task, {"key_task_id": TASK, **now}),
        "refuse_approval": (sql.refuse_approval, {"key_task_id": TASK, **now}),
        "refused": (sql.refused, holder),
        "select_receipt": (sql.select_receipt, {"key_idempotency_key": "fill-5:s3"}),
        "select_task": (sql.select_task, {"key_task_id": TASK}),
        "expired_first": (sql.expired_first, {"limit": 100, **now}),
        "expired_after": (
            sql.expired_after,
            {"limit": 100, "after_expires_at_ms": 0, "after_task_id": "", **now},
        ),
        "record_expiries": (
            record_statement(dialect),
            {
                **batch_params(
                    dialect,
                    [
                        {
                            "task_id": TASK,
                            "claim_generation": 1,
                            "lease_expires_at_ms": 1_700_000_030_000,
                            "status": "released",
                            "last_error": "x",
                        },
                        {
                            "task_id": "fill-6/s1",
                            "claim_generation": 1,
                            "lease_expires_at_ms": 1,
                            "status": "released",
                            "last_error": "y",
                        },
                    ],
                ),
                **now,
            },
        ),
        "run_exists": (run_exists(RUN), {}),
        "runs_page": (runs_page(None, 100), {}),
        "runs_page_after": (runs_page("fill-5", 100), {}),
        "runs_page_waiting": (runs_page("fill-5", 100, waiting_only=True), {}),
    }
    writes = lease_writes(dialect)
    claimed = {"key_task_id": TASK, "lease_owner": "w", **trace.columns(), **now, **gate, **ttl}
    ended = {"status": "released", "error_class": "retryable", "last_error": "x", "attempts_returned": 0}
    lease_writes_params: dict[str, tuple[Rendered, dict[str, Any]]] = {
        "claim_new": (writes.claim_new, task_values),
        "claim": (writes.claim, claimed),
        "renew": (writes.renew, {**holder, "new_stage": "commit", **ttl}),
        "settle": (writes.settle, {**holder, "receipt": receipt}),
        "end_lease": (writes.end_lease, {**holder, **ended}),
    }
    for kind in DecisionKind:
        params: dict[str, Any] = {"key_task_id": TASK, **now}
        if kind is DecisionKind.CONFIRM:
            params["receipt"] = receipt
        if kind is DecisionKind.APPROVE:
            params.update(approval_tool="t", approval_arguments_sha256="0" * 64)
        lease_writes_params[f"decision_{kind.value}"] = (writes.decision(kind), params)
    for name, (write, params) in lease_writes_params.items():
        parts = {"statement": write.statement, "first": write.first, "change": write.change, "result": write.result}
        parts.update({f"made_{index}": made for index, made in enumerate(write.made)})
        for part, statement in parts.items():
            if statement is not None:
                statements[f"{name}_{part}"] = (statement, {**params, **event})
    cursor = (1_700_000_000_500, "fill-50/s0")
    for name, which in {
        "all": TaskFilter(),
        "run": TaskFilter(agent_run_id=RUN),
        "waiting": TaskFilter(waiting=True),
        "status": TaskFilter(statuses=frozenset({TaskStatus.RUNNING})),
        "since": TaskFilter(since_ms=1_700_000_000_100),
    }.items():
        statements[f"tasks_page_{name}"] = (tasks_page(which, None, 100), {})
        statements[f"tasks_page_{name}_after"] = (tasks_page(which, cursor, 100), {})
    for name, subject in {
        "task": {"task_id": TASK, "agent_run_id": None},
        "run": {"task_id": None, "agent_run_id": RUN},
    }.items():
        statements[f"events_page_{name}"] = (events_page(dialect, after=None, limit=100, **subject), {})
        statements[f"events_page_{name}_after"] = (events_page(dialect, after=3, limit=100, **subject), {})
    return statements


@pytest.fixture
async def filled(ledger: Ledger) -> Ledger:
    await fill_ledger(ledger.database, Fill(tasks=ROWS, expired=ROWS // 100))
    return ledger


async def test_no_statement_scans_a_table_of_a_large_ledger(filled: Ledger) -> None:
    dialect = filled.database.dialect
    statements = statements_to_explain(dialect)

    def explain_all(conn: Connection) -> dict[str, str]:
        return {name: plan(conn, statement, params) for name, (statement, params) in statements.items()}

    plans = await filled.database.read(explain_all)
    scanning = {name: full_scans(dialect, text) for name, text in plans.items() if full_scans(dialect, text)}
    assert scanning == {}, "\n\n".join(f"{name}:\n{plans[name]}" for name in scanning)


async def test_keyset_pages_read_their_own_index(filled: Ledger) -> None:
    """A page is a bounded walk of the index in the page's order, never the whole table sorted."""
    dialect = filled.database.dialect
    expected = {
        "tasks_page_all_after": "ix_tasks_created_at_ms_task_id",
        "tasks_page_run_after": "ix_tasks_agent_run_id_created_at_ms",
        "tasks_page_waiting_after": "ix_tasks_waiting_created_at_ms",
        "tasks_page_status_after": "ix_tasks_status_created_at_ms",
        "events_page_task_after": "ix_lease_events_task_id_event_id",
        "events_page_run_after": "ix_lease_events_task_id_event_id",
        "runs_page_after": "ix_tasks_agent_run_id_created_at_ms",
    }
    statements = statements_to_explain(dialect)

    def explain(conn: Connection) -> dict[str, str]:
        return {name: plan(conn, *statements[name]) for name in expected}

    plans = await filled.database.read(explain)
    missing = {name: plans[name] for name, index in expected.items() if index not in plans[name]}
    assert missing == {}, "\n\n".join(f"{name} (wants {expected[name]}):\n{text}" for name, text in missing.items())
