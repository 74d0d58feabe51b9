"""lease tokens, receipts bound to their action, the authenticated role in the evidence trail

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 21:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_token_sha256", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("arguments_sha256", sa.String(length=64), nullable=True))
    with op.batch_alter_table("lease_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("authenticated_as", sa.String(length=128), nullable=True))
    with op.batch_alter_table("receipts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tool", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("arguments_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("receipts", schema=None) as batch_op:
        batch_op.drop_column("arguments_sha256")
        batch_op.drop_column("tool")
    with op.batch_alter_table("lease_events", schema=None) as batch_op:
        batch_op.drop_column("authenticated_as")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("arguments_sha256")
        batch_op.drop_column("lease_token_sha256")
