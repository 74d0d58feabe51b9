"""signed decisions applied once: their decision ids, recorded unique per task

``decisions_applied`` and ``decision_replays`` (the first refused replay of each id), insert-only for the worker
role; on PostgreSQL the trail's guard also ties an entry naming a signer to the step its signed request names
(``docs/security-review.md``).

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


_EVENTS_GUARD = """
CREATE OR REPLACE FUNCTION agentlease_events_guard() RETURNS trigger LANGUAGE plpgsql AS $guard$
DECLARE
    signed_step text;
BEGIN
    NEW.authenticated_as := session_user;
    IF NEW.details IS NOT NULL AND strpos(NEW.details::text, 'signed_by') > 0
       AND json_typeof(NEW.details) = 'object' AND NEW.details::jsonb ? 'signed_by' THEN
        IF (NEW.details::jsonb #>> '{signed,request,proof,operator}') IS DISTINCT FROM
           (NEW.details::jsonb ->> 'signed_by') THEN
            RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'agentlease ledger guard: ' ||
                format('an entry of task %s names signed_by only beside the signed decision of that operator',
                       NEW.task_id);
        END IF;
        signed_step := NEW.details::jsonb #>> '{signed,request,step_id}';
        IF signed_step IS NOT NULL AND right(NEW.task_id, length(signed_step) + 1) <> '/' || signed_step THEN
            RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'agentlease ledger guard: ' ||
                format('an entry of task %s names signed_by beside a signed decision of step %s', NEW.task_id,
                       signed_step);
        END IF;
    END IF;
    RETURN NEW;
END
$guard$;
"""
"""The trail's guard of migration 0006, and: the signed request's step is the entry's (a step id has no ``/``)."""

_EVENTS_GUARD_0006 = """
CREATE OR REPLACE FUNCTION agentlease_events_guard() RETURNS trigger LANGUAGE plpgsql AS $guard$
BEGIN
    NEW.authenticated_as := session_user;
    IF NEW.details IS NOT NULL AND strpos(NEW.details::text, 'signed_by') > 0
       AND json_typeof(NEW.details) = 'object' AND NEW.details::jsonb ? 'signed_by'
       AND (NEW.details::jsonb #>> '{signed,request,proof,operator}') IS DISTINCT FROM
           (NEW.details::jsonb ->> 'signed_by') THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'agentlease ledger guard: ' ||
            format('an entry of task %s names signed_by only beside the signed decision of that operator',
                   NEW.task_id);
    END IF;
    RETURN NEW;
END
$guard$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_EVENTS_GUARD)
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
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_EVENTS_GUARD_0006)
