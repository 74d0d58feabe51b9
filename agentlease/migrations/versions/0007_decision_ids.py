"""signed decisions applied once: their decision ids, recorded unique per task

``decisions_applied`` holds the decision id of each signed decision applied to a task (primary key
``(decision_id, task_id)``: a cancel of a whole run applies one id to each of its tasks), with the
decision, its operator, the generation it was signed for and the Temporal activity that applied it;
``decision_replays`` holds the first refused replay of each, so its trail entry is written once.
Both are insert-only for the worker role (``agentlease db grant``: INSERT and SELECT).

Revision ID: 0007
Revises: 0006
Create Date: 2027-01-15 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TABLES = (("decisions_applied", "applied_at_ms"), ("decision_replays", "refused_at_ms"))


def upgrade() -> None:
    for table, at in _TABLES:
        op.create_table(
            table,
            sa.Column("decision_id", sa.String(length=64), nullable=False),
            sa.Column("task_id", sa.String(length=400), nullable=False),
            sa.Column("kind", sa.String(length=24), nullable=False),
            sa.Column("operator", sa.String(length=200), nullable=False),
            sa.Column("generation", sa.BigInteger(), nullable=True),
            sa.Column("workflow_id", sa.String(length=255), nullable=True),
            sa.Column("run_id", sa.String(length=64), nullable=True),
            sa.Column("activity_id", sa.String(length=255), nullable=True),
            sa.Column(at, sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("decision_id", "task_id", name=op.f(f"pk_{table}")),
        )


def downgrade() -> None:
    for table, _ in reversed(_TABLES):
        op.drop_table(table)
