"""renewals in place: no index holds the lease's expiry, so a renewal changes no indexed column

Revision ID: 0010
Revises: 0009
Create Date: 2027-02-15 09:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_status_lease_expires_at_ms")


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index("ix_tasks_status_lease_expires_at_ms", ["status", "lease_expires_at_ms"], unique=False)
