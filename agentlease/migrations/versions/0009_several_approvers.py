"""several approvers: the approvals given to a request, and when the approval (or the first of them) lapses

Revision ID: 0009
Revises: 0008
Create Date: 2027-02-08 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("approvals", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("approval_expires_at_ms", sa.BigInteger(), nullable=True))
        batch_op.create_index("ix_tasks_approval_expires_at_ms", ["approval_expires_at_ms"])


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_approval_expires_at_ms")
        batch_op.drop_column("approval_expires_at_ms")
        batch_op.drop_column("approvals")
