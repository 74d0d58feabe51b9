"""initial ledger: tasks, lease_events, receipts

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 10:59:47.943669
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lease_events",
        sa.Column("event_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(length=400), nullable=False),
        sa.Column("kind", sa.String(length=24), nullable=False),
        sa.Column("claim_generation", sa.BigInteger(), nullable=False),
        sa.Column("lease_owner", sa.String(length=255), nullable=True),
        sa.Column("stage", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=True),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("trace_workflow_id", sa.String(length=255), nullable=True),
        sa.Column("trace_run_id", sa.String(length=64), nullable=True),
        sa.Column("trace_activity_id", sa.String(length=255), nullable=True),
        sa.Column("trace_attempt", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_lease_events")),
    )
    with op.batch_alter_table("lease_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_lease_events_task_id"), ["task_id"], unique=False)

    op.create_table(
        "receipts",
        sa.Column("idempotency_key", sa.String(length=256), nullable=False),
        sa.Column("task_id", sa.String(length=400), nullable=False),
        sa.Column("claim_generation", sa.BigInteger(), nullable=False),
        sa.Column("receipt", sa.JSON(), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("idempotency_key", name=op.f("pk_receipts")),
    )
    with op.batch_alter_table("receipts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_receipts_task_id"), ["task_id"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("task_id", sa.String(length=400), nullable=False),
        sa.Column("agent_run_id", sa.String(length=255), nullable=False),
        sa.Column("step_id", sa.String(length=128), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("side_effect_class", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=True),
        sa.Column("lease_owner", sa.String(length=255), nullable=True),
        sa.Column("lease_acquired_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("lease_expires_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("lease_ttl_ms", sa.BigInteger(), nullable=False),
        sa.Column("claim_generation", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("renewal_count", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=256), nullable=False),
        sa.Column("receipt", sa.JSON(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("error_class", sa.String(length=64), nullable=True),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("trace_workflow_id", sa.String(length=255), nullable=True),
        sa.Column("trace_run_id", sa.String(length=64), nullable=True),
        sa.Column("trace_activity_id", sa.String(length=255), nullable=True),
        sa.Column("trace_attempt", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_tasks")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_agent_run_id"), ["agent_run_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_idempotency_key"), ["idempotency_key"], unique=False)
        batch_op.create_index("ix_tasks_status_lease_expires_at_ms", ["status", "lease_expires_at_ms"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_status_lease_expires_at_ms")
        batch_op.drop_index(batch_op.f("ix_tasks_idempotency_key"))
        batch_op.drop_index(batch_op.f("ix_tasks_agent_run_id"))

    op.drop_table("tasks")
    with op.batch_alter_table("receipts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_receipts_task_id"))

    op.drop_table("receipts")
    with op.batch_alter_table("lease_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_lease_events_task_id"))

    op.drop_table("lease_events")
