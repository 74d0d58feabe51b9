"""approvals bound to one execution: when, of which tool and arguments, consumed by which generation

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-08 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("approved_at_ms", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("approval_tool", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("approval_arguments_sha256", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("approval_consumed_generation", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("approval_consumed_generation")
        batch_op.drop_column("approval_arguments_sha256")
        batch_op.drop_column("approval_tool")
        batch_op.drop_column("approved_at_ms")
