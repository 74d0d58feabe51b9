"""Ledger tables (SQLAlchemy 2.0 declarative). The migrations in ``agentlease/migrations`` make them.

Times are epoch milliseconds judged on the database's clock (``_ms`` columns, see
:mod:`agentlease.clock`). Every constraint is named through the metadata's naming convention.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Index, Integer, MetaData, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY.
_EventId = BigInteger().with_variant(Integer(), "sqlite")


WAITING_PREDICATE = (
    "status IN ('awaiting_approval', 'blocked', 'needs_reconciliation', 'dead_lettered', 'cancelled_effect_unknown')"
)
"""SQL of the statuses that wait for a person (``TaskStatus.waits_for_person``): the partial index of
``agentlease waiting``. ``tests/unit/test_listing_predicate.py`` checks it against the enum."""


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class _TraceColumns:
    """Links into Temporal: workflow id / run id / activity id / attempt of the writing attempt, and
    the OpenTelemetry trace id (32 hex digits) of that attempt when tracing is on (``docs/tracing.md``)."""

    trace_workflow_id: Mapped[str | None] = mapped_column(String(255))
    trace_run_id: Mapped[str | None] = mapped_column(String(64))
    trace_activity_id: Mapped[str | None] = mapped_column(String(255))
    trace_attempt: Mapped[int | None] = mapped_column(Integer)
    trace_id: Mapped[str | None] = mapped_column(String(32))


class TaskRow(_TraceColumns, Base):
    """One task: lifecycle, current authority and logical action identity kept apart."""

    __tablename__ = "tasks"

    task_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    agent_run_id: Mapped[str] = mapped_column(String(255))
    step_id: Mapped[str] = mapped_column(String(128))
    tool: Mapped[str] = mapped_column(String(128))
    side_effect_class: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(24))
    stage: Mapped[str | None] = mapped_column(String(16))
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_acquired_at_ms: Mapped[int | None] = mapped_column(BigInteger)
    lease_expires_at_ms: Mapped[int | None] = mapped_column(BigInteger)
    lease_ttl_ms: Mapped[int] = mapped_column(BigInteger)
    claim_generation: Mapped[int] = mapped_column(BigInteger, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    renewal_count: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str] = mapped_column(String(256), index=True)
    receipt: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The SHA-256 (hex) of the current claim's lease token: every holder write presents the token
    # (``docs/security.md``, "Lease tokens"); the token itself is never stored.
    lease_token_sha256: Mapped[str | None] = mapped_column(String(64))
    # The fingerprint of the call's arguments (SHA-256 of their canonical JSON): a stored receipt
    # settles a task only for the same tool and arguments.
    arguments_sha256: Mapped[str | None] = mapped_column(String(64))
    # The approval of an approval-gated call, bound to one execution (``docs/recovery.md``,
    # "Approvals"): when it was given (ledger clock), the tool and the arguments' fingerprint the person
    # saw, and the claim generation that consumed it (``NULL``: not consumed yet). A claim of such a task
    # needs an approval of its tool and arguments, younger than the tool's approval TTL, not consumed.
    approved_at_ms: Mapped[int | None] = mapped_column(BigInteger)
    approval_tool: Mapped[str | None] = mapped_column(String(128))
    approval_arguments_sha256: Mapped[str | None] = mapped_column(String(64))
    approval_consumed_generation: Mapped[int | None] = mapped_column(BigInteger)
    last_error: Mapped[str | None] = mapped_column(Text)
    error_class: Mapped[str | None] = mapped_column(String(64))
    created_at_ms: Mapped[int] = mapped_column(BigInteger)
    updated_at_ms: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        # The sweeper: running tasks by lease expiry.
        Index("ix_tasks_status_lease_expires_at_ms", "status", "lease_expires_at_ms"),
        # Operator listings, each read in keyset pages on (created_at_ms, task_id): all tasks, one
        # run's tasks (and the runs, grouped), tasks of one status, and the tasks waiting for a person.
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


class LeaseEventRow(_TraceColumns, Base):
    """The evidence trail: claims, renewals with stage and reason, releases, settles, lease losses."""

    __tablename__ = "lease_events"

    event_id: Mapped[int] = mapped_column(_EventId, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(400))
    kind: Mapped[str] = mapped_column(String(24))
    claim_generation: Mapped[int] = mapped_column(BigInteger)
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    stage: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    at_ms: Mapped[int] = mapped_column(BigInteger)
    # The database role the writer authenticated as (PostgreSQL ``session_user``), beside the
    # configured ``lease_owner``; ``NULL`` on SQLite, which authenticates nobody.
    authenticated_as: Mapped[str | None] = mapped_column(String(128))

    # One task's trail in order (and a run's, task by task), read in keyset pages on event_id.
    __table_args__ = (Index("ix_lease_events_task_id_event_id", "task_id", "event_id"),)


class ReceiptRow(Base):
    """Settlement receipts, unique per idempotency key."""

    __tablename__ = "receipts"

    idempotency_key: Mapped[str] = mapped_column(String(256), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(400), index=True)
    claim_generation: Mapped[int] = mapped_column(BigInteger)
    receipt: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at_ms: Mapped[int] = mapped_column(BigInteger)
    # What the receipt is for: a task of another tool or other arguments with the same key is
    # refused, not settled with it (``docs/security.md``, "Receipts and tasks bound to their run").
    tool: Mapped[str | None] = mapped_column(String(128))
    arguments_sha256: Mapped[str | None] = mapped_column(String(64))


class _DecisionIdColumns:
    """One signed decision's id on one task (``docs/security.md``, "Authenticated decisions"): the
    operator's decision id (a cancel of a whole run applies one id to each of its tasks), the decision,
    its operator, the generation it was signed for (``NULL``: not bound), and the Temporal activity that
    used it first (a retry of that same activity is not a replay)."""

    decision_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    kind: Mapped[str] = mapped_column(String(24))
    operator: Mapped[str] = mapped_column(String(200))
    generation: Mapped[int | None] = mapped_column(BigInteger)
    workflow_id: Mapped[str | None] = mapped_column(String(255))
    run_id: Mapped[str | None] = mapped_column(String(64))
    activity_id: Mapped[str | None] = mapped_column(String(255))


class DecisionAppliedRow(_DecisionIdColumns, Base):
    """A signed decision applied to a task: its decision id, once. Insert-only (worker role: INSERT, SELECT)."""

    __tablename__ = "decisions_applied"

    applied_at_ms: Mapped[int] = mapped_column(BigInteger)


class DecisionReplayRow(_DecisionIdColumns, Base):
    """The first replay of a signed decision on a task, refused: its trail entry is written once per
    decision id, however often it is sent again. Insert-only, like :class:`DecisionAppliedRow`; the
    activity columns are the replaying one's."""

    __tablename__ = "decision_replays"

    refused_at_ms: Mapped[int] = mapped_column(BigInteger)
