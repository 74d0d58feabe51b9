"""indexes for bounded operator queries: keyset pages of tasks, runs, waiting tasks and the trail

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

WAITING = (
    "status IN ('awaiting_approval', 'blocked', 'needs_reconciliation', 'dead_lettered', 'cancelled_effect_unknown')"
)


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_agent_run_id")
        batch_op.create_index("ix_tasks_agent_run_id_created_at_ms", ["agent_run_id", "created_at_ms", "task_id"])
        batch_op.create_index("ix_tasks_created_at_ms_task_id", ["created_at_ms", "task_id"])
        batch_op.create_index("ix_tasks_status_created_at_ms", ["status", "created_at_ms", "task_id"])
        batch_op.create_index(
            "ix_tasks_waiting_created_at_ms",
            ["created_at_ms", "task_id"],
            postgresql_where=sa.text(WAITING),
            sqlite_where=sa.text(WAITING),
        )
    with op.batch_alter_table("lease_events", schema=None) as batch_op:
        batch_op.drop_index("ix_lease_events_task_id")
        batch_op.create_index("ix_lease_events_task_id_event_id", ["task_id", "event_id"])


def downgrade() -> None:
    with op.batch_alter_table("lease_events", schema=None) as batch_op:
        batch_op.drop_index("ix_lease_events_task_id_event_id")
        batch_op.create_index("ix_lease_events_task_id", ["task_id"])
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_waiting_created_at_ms")
        batch_op.drop_index("ix_tasks_status_created_at_ms")
        batch_op.drop_index("ix_tasks_created_at_ms_task_id")
        batch_op.drop_index("ix_tasks_agent_run_id_created_at_ms")
        batch_op.create_index("ix_tasks_agent_run_id", ["agent_run_id"])
