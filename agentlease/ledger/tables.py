"""Ledger tables (SQLAlchemy Core), made by the migrations in ``agentlease/migrations``. Times (``_ms``) are
epoch milliseconds on the database's clock; every constraint is named by the naming convention."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Column, Index, Integer, MetaData, String, Table, Text, text

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)  # the migrations' target_metadata

# SQLite only auto-increments an INTEGER PRIMARY KEY.
_EventId = BigInteger().with_variant(Integer(), "sqlite")


WAITING_PREDICATE = (
    "status IN ('awaiting_approval', 'blocked', 'needs_reconciliation', 'dead_lettered', 'cancelled_effect_unknown')"
)
"""SQL of the statuses that wait for a person (``TaskStatus.waits_for_person``): the partial index of
``agentlease waiting``. ``tests/unit/test_listing_predicate.py`` checks it against the enum."""


def _trace_columns() -> list[Column[object]]:
    """The writing attempt's Temporal ids and its OpenTelemetry trace id when tracing is on (``docs/tracing.md``)."""
    return [
        Column("trace_workflow_id", String(255), nullable=True),
        Column("trace_run_id", String(64), nullable=True),
        Column("trace_activity_id", String(255), nullable=True),
        Column("trace_attempt", Integer, nullable=True),
        Column("trace_id", String(32), nullable=True),
    ]


TASKS = Table(
    "tasks",
    metadata,
    Column("task_id", String(400), primary_key=True),
    Column("agent_run_id", String(255), nullable=False),
    Column("step_id", String(128), nullable=False),
    Column("tool", String(128), nullable=False),
    Column("side_effect_class", String(16), nullable=False),
    Column("status", String(24), nullable=False),
    Column("stage", String(16), nullable=True),
    Column("lease_owner", String(255), nullable=True),
    Column("lease_acquired_at_ms", BigInteger, nullable=True),
    Column("lease_expires_at_ms", BigInteger, nullable=True),
    Column("lease_ttl_ms", BigInteger, nullable=False),
    Column("claim_generation", BigInteger, nullable=False, default=0),
    Column("attempts", Integer, nullable=False, default=0),
    Column("renewal_count", Integer, nullable=False, default=0),
    Column("idempotency_key", String(256), nullable=False, index=True),
    Column("receipt", JSON, nullable=True),
    # The SHA-256 (hex) of the current claim's lease token (``docs/security-review.md``, "Lease tokens").
    Column("lease_token_sha256", String(64), nullable=True),
    # The SHA-256 of the call's arguments' canonical JSON: a receipt settles only the same tool and arguments.
    Column("arguments_sha256", String(64), nullable=True),
    # The approval bound to one execution (``docs/decisions.md``, "Approvals"): when, of which tool and
    # arguments, and the claim generation that consumed it (``NULL``: not yet).
    Column("approved_at_ms", BigInteger, nullable=True),
    Column("approval_tool", String(128), nullable=True),
    Column("approval_arguments_sha256", String(64), nullable=True),
    Column("approval_consumed_generation", BigInteger, nullable=True),
    # What a person was last asked to approve: tool, redacted arguments, their fingerprint (ApprovalRequest).
    Column("approval_request", JSON, nullable=True),
    # The approvals given to that request, each ``{"by": who, "at_ms": when}`` (several when the tool asks for
    # more than one person), and when the approval, or the first of those given, lapses (tool's approval TTL).
    Column("approvals", JSON, nullable=True),
    Column("approval_expires_at_ms", BigInteger, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("error_class", String(64), nullable=True),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("updated_at_ms", BigInteger, nullable=False),
    *_trace_columns(),
    # The sweeper: approvals about to lapse.
    Index("ix_tasks_approval_expires_at_ms", "approval_expires_at_ms"),
    # Operator listings, each read in keyset pages on (created_at_ms, task_id): all tasks, one
    # run's tasks (and the runs, grouped), tasks of one status, and the tasks waiting for a person.
    # The sweeper finds the running tasks through the status index. No index holds a column a renewal
    # writes (lease_expires_at_ms, stage, renewal_count, updated_at_ms): PostgreSQL updates a renewed row
    # in place, with no index entry (a HOT update; docs/operations.md, "The sweeper").
    Index("ix_tasks_created_at_ms_task_id", "created_at_ms", "task_id"),
    Index("ix_tasks_agent_run_id_created_at_ms", "agent_run_id", "created_at_ms", "task_id"),
    Index("ix_tasks_status_created_at_ms", "status", "created_at_ms", "task_id"),
    Index(
        "ix_tasks_waiting_created_at_ms",
        "created_at_ms",
        "task_id",
        postgresql_where=text(WAITING_PREDICATE),
        sqlite_where=text(WAITING_PREDICATE),
    ),
)
"""One task: lifecycle, current authority and logical action identity kept apart."""

EVENTS = Table(
    "lease_events",
    metadata,
    Column("event_id", _EventId, primary_key=True, autoincrement=True),
    Column("task_id", String(400), nullable=False),
    Column("kind", String(24), nullable=False),
    Column("claim_generation", BigInteger, nullable=False),
    Column("lease_owner", String(255), nullable=True),
    Column("stage", String(16), nullable=True),
    Column("reason", Text, nullable=True),
    Column("details", JSON, nullable=True),
    Column("at_ms", BigInteger, nullable=False),
    # The database role the writer authenticated as (PostgreSQL ``session_user``), beside the
    # configured ``lease_owner``; ``NULL`` on SQLite, which authenticates nobody.
    Column("authenticated_as", String(128), nullable=True),
    *_trace_columns(),
    # One task's trail in order (and a run's, task by task), read in keyset pages on event_id.
    Index("ix_lease_events_task_id_event_id", "task_id", "event_id"),
)
"""The evidence trail: claims, renewals with stage and reason, releases, settles, lease losses."""

RECEIPTS = Table(
    "receipts",
    metadata,
    Column("idempotency_key", String(256), primary_key=True),
    Column("task_id", String(400), nullable=False, index=True),
    Column("claim_generation", BigInteger, nullable=False),
    Column("receipt", JSON, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    # What the receipt is for: a task of another tool or arguments with the same key is refused.
    Column("tool", String(128), nullable=True),
    Column("arguments_sha256", String(64), nullable=True),
)
"""Settlement receipts, unique per idempotency key."""


def _decision_id_columns() -> list[Column[object]]:
    """One signed decision's id on one task, its operator, generation (``NULL``: not bound) and activity."""
    return [
        Column("decision_id", String(64), primary_key=True),
        Column("task_id", String(400), primary_key=True),
        Column("kind", String(24), nullable=False),
        Column("operator", String(200), nullable=False),
        Column("generation", BigInteger, nullable=True),
        Column("workflow_id", String(255), nullable=True),
        Column("run_id", String(64), nullable=True),
        Column("activity_id", String(255), nullable=True),
    ]


DECISIONS_APPLIED = Table(
    "decisions_applied", metadata, Column("applied_at_ms", BigInteger, nullable=False), *_decision_id_columns()
)
"""A signed decision applied to a task: its decision id, once. Insert-only (worker role: INSERT, SELECT)."""

DECISION_REPLAYS = Table(
    "decision_replays", metadata, Column("refused_at_ms", BigInteger, nullable=False), *_decision_id_columns()
)
"""The first refused replay of a signed decision on a task (its trail entry is written once). Insert-only."""
