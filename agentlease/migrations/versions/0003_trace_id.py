"""trace id: the OpenTelemetry trace of the attempt, on tasks and on each evidence-trail entry

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 21:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("tasks", "lease_events"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("trace_id", sa.String(length=32), nullable=True))


def downgrade() -> None:
    for table in ("lease_events", "tasks"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("trace_id")
