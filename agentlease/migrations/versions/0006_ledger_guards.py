"""guards on PostgreSQL: the worker role writes leases only as the product's statements do

Row-level triggers on ``tasks``, ``receipts`` and ``lease_events`` (PostgreSQL only) refuse, with
SQLSTATE 42501 and the rule's name, the writes no lease operation makes, for every role but the tables'
owner. The allowed status changes are data frozen with this revision. Each rule:
``docs/security-review.md`` ("What a worker's database role can still do").

Revision ID: 0006
Revises: 0005
Create Date: 2027-01-10 12:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TRANSITIONS = (
    # a claim (a new generation), and the claim of a lapsed lease
    ("pending", "running"),
    ("released", "running"),
    ("running", "running"),
    # the holder's settle and lease ends; the sweeper's expiries
    ("running", "settled"),
    ("running", "released"),
    ("running", "dead_lettered"),
    ("running", "blocked"),
    ("running", "needs_reconciliation"),
    # a refused call recorded on its own task
    ("pending", "dead_lettered"),
    ("released", "dead_lettered"),
    # the decision table
    ("pending", "awaiting_approval"),
    ("awaiting_approval", "pending"),
    ("awaiting_approval", "rejected"),
    ("needs_reconciliation", "settled"),
    ("needs_reconciliation", "released"),
    ("needs_reconciliation", "abandoned"),
    ("dead_lettered", "released"),
    ("blocked", "released"),
    ("pending", "cancelled"),
    ("awaiting_approval", "cancelled"),
    ("running", "cancelled"),
    ("released", "cancelled"),
    ("blocked", "cancelled"),
    ("needs_reconciliation", "cancelled"),
    ("dead_lettered", "cancelled"),
    ("pending", "cancelled_effect_unknown"),
    ("awaiting_approval", "cancelled_effect_unknown"),
    ("running", "cancelled_effect_unknown"),
    ("released", "cancelled_effect_unknown"),
    ("blocked", "cancelled_effect_unknown"),
    ("needs_reconciliation", "cancelled_effect_unknown"),
    ("dead_lettered", "cancelled_effect_unknown"),
    ("cancelled_effect_unknown", "cancelled"),
)
"""Every status change a role other than the owner may make (a status may also stay as it is)."""

STAGE_ORDER = (("preflight", 0), ("external_call", 1), ("commit", 2), ("verify", 3), ("settled", 4))
"""The stages in order (G6: the recorded stage never goes back)."""

_NOT_OWNER = "NOT pg_has_role(current_user, CAST({owner} AS oid), 'MEMBER')"
"""The trigger's ``WHEN``: the writer does not own the table (nor is a superuser; the owner's oid is read when
migrating)."""

_NOW = "floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint"
"""The ledger's clock, as the lease statements read it (``agentlease.clock``)."""


def _refuse(rule: str) -> str:
    return f"RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'agentlease ledger guard: ' || {rule};"


def _rank(value: str) -> str:
    cases = " ".join(f"WHEN '{stage}' THEN {order}" for stage, order in STAGE_ORDER)
    return f"(CASE {value} {cases} ELSE -1 END)"


def _tasks_guard() -> str:
    pairs = ", ".join(f"('{a}', '{b}')" for a, b in TRANSITIONS)
    return f"""
CREATE OR REPLACE FUNCTION agentlease_tasks_guard() RETURNS trigger LANGUAGE plpgsql AS $guard$
DECLARE
    now_ms bigint := {_NOW};
BEGIN
    IF NEW.status = 'running' AND (NEW.lease_owner IS NULL OR NEW.lease_token_sha256 IS NULL) THEN
        {_refuse("format('a running task %s has an owner and a lease token', NEW.task_id)")}
    END IF;
    IF NEW.lease_expires_at_ms IS NOT NULL AND NEW.lease_expires_at_ms > now_ms + NEW.lease_ttl_ms
       AND (TG_OP = 'INSERT' OR NEW.lease_expires_at_ms IS DISTINCT FROM OLD.lease_expires_at_ms) THEN
        {_refuse("format('task %s: a lease lapses at most one TTL from now', NEW.task_id)")}
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NOT ((NEW.status = 'pending' AND NEW.claim_generation = 0 AND NEW.lease_owner IS NULL
                 AND NEW.lease_token_sha256 IS NULL)
                OR (NEW.status = 'running' AND NEW.claim_generation = 1))
           OR NEW.receipt IS NOT NULL OR NEW.stage IS NOT NULL THEN
            {_refuse("format('task %s: a new task is pending, or claimed by its first generation', NEW.task_id)")}
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.task_id <> OLD.task_id OR NEW.agent_run_id <> OLD.agent_run_id OR NEW.step_id <> OLD.step_id
       OR NEW.tool <> OLD.tool OR NEW.side_effect_class <> OLD.side_effect_class
       OR NEW.idempotency_key <> OLD.idempotency_key
       OR NEW.arguments_sha256 IS DISTINCT FROM OLD.arguments_sha256
       OR NEW.created_at_ms <> OLD.created_at_ms THEN
        {_refuse("format('task %s: what the task is (run, step, tool, key, arguments) never changes', OLD.task_id)")}
    END IF;
    IF NEW.lease_ttl_ms > OLD.lease_ttl_ms THEN
        {_refuse("format('task %s: a lease TTL is never lengthened', OLD.task_id)")}
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status
       AND (OLD.status, NEW.status) NOT IN ({pairs}) THEN
        {
        _refuse("format('task %s: no lease operation or decision moves %s to %s', OLD.task_id, OLD.status, NEW.status)")
    }
    END IF;
    IF NEW.claim_generation <> OLD.claim_generation THEN
        IF NEW.claim_generation <> OLD.claim_generation + 1 OR NEW.status <> 'running'
           OR NOT (OLD.status IN ('pending', 'released')
                   OR (OLD.status = 'running' AND OLD.lease_expires_at_ms <= now_ms)) THEN
            {
        _refuse(
            "format('task %s: generation %s becomes %s only by a claim (one up, of a claimable task)', "
            "OLD.task_id, OLD.claim_generation, NEW.claim_generation)"
        )
    }
        END IF;
    ELSE
        IF NEW.status = 'running' AND OLD.status <> 'running' THEN
            {_refuse("format('task %s: a claim mints the next generation', OLD.task_id)")}
        END IF;
        IF (NEW.lease_owner IS NOT NULL AND NEW.lease_owner IS DISTINCT FROM OLD.lease_owner)
           OR (NEW.lease_token_sha256 IS NOT NULL
               AND NEW.lease_token_sha256 IS DISTINCT FROM OLD.lease_token_sha256) THEN
            {_refuse("format('task %s: an owner and a lease token come only with a new generation', OLD.task_id)")}
        END IF;
    END IF;
    IF OLD.receipt IS NOT NULL AND (NEW.receipt IS NULL OR NEW.receipt::jsonb <> OLD.receipt::jsonb) THEN
        {_refuse("format('task %s: a settlement receipt, once recorded, stands', OLD.task_id)")}
    END IF;
    IF OLD.receipt IS NULL AND NEW.receipt IS NOT NULL AND NEW.status NOT IN ('settled', 'cancelled') THEN
        {_refuse("format('task %s: a receipt is recorded only by a settle or a confirm', OLD.task_id)")}
    END IF;
    IF {_rank("NEW.stage")} < {_rank("OLD.stage")} THEN
        {_refuse("format('task %s: the recorded stage never goes back (%s to %s)', OLD.task_id, OLD.stage, NEW.stage)")}
    END IF;
    RETURN NEW;
END
$guard$;
"""


def _receipts_guard(schema: str) -> str:
    tasks = '"' + schema.replace('"', '""') + '".tasks'
    return f"""
CREATE OR REPLACE FUNCTION agentlease_receipts_guard() RETURNS trigger LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF (NEW.idempotency_key, NEW.task_id, NEW.claim_generation, NEW.receipt::jsonb, NEW.created_at_ms,
            NEW.tool, NEW.arguments_sha256)
           IS DISTINCT FROM (OLD.idempotency_key, OLD.task_id, OLD.claim_generation, OLD.receipt::jsonb,
                             OLD.created_at_ms, OLD.tool, OLD.arguments_sha256) THEN
            {_refuse("format('the receipt of key %s, once stored, stands', OLD.idempotency_key)")}
        END IF;
        RETURN NEW;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM {tasks} t
        WHERE t.task_id = NEW.task_id AND t.idempotency_key = NEW.idempotency_key
          AND t.tool IS NOT DISTINCT FROM NEW.tool AND t.arguments_sha256 IS NOT DISTINCT FROM NEW.arguments_sha256
          AND t.claim_generation = NEW.claim_generation
          AND t.status IN ('running', 'settled', 'cancelled')
    ) THEN
        {
        _refuse(
            "format('a receipt of key %s is stored only for its own task, tool, arguments and generation', "
            "NEW.idempotency_key)"
        )
    }
    END IF;
    RETURN NEW;
END
$guard$;
"""


def _events_guard() -> str:
    return f"""
CREATE OR REPLACE FUNCTION agentlease_events_guard() RETURNS trigger LANGUAGE plpgsql AS $guard$
BEGIN
    NEW.authenticated_as := session_user;
    IF NEW.details IS NOT NULL AND strpos(NEW.details::text, 'signed_by') > 0
       AND json_typeof(NEW.details) = 'object' AND NEW.details::jsonb ? 'signed_by'
       AND (NEW.details::jsonb #>> '{{signed,request,proof,operator}}') IS DISTINCT FROM
           (NEW.details::jsonb ->> 'signed_by') THEN
        {
        _refuse(
            "format('an entry of task %s names signed_by only beside the signed decision of that operator', "
            "NEW.task_id)"
        )
    }
    END IF;
    RETURN NEW;
END
$guard$;
"""


_TRIGGERS = (
    ("tasks", "agentlease_tasks_guard", "INSERT OR UPDATE"),
    ("receipts", "agentlease_receipts_guard", "INSERT OR UPDATE"),
    ("lease_events", "agentlease_events_guard", "INSERT"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite authenticates nobody: one process's file, guarded by its permissions
    bind = op.get_bind()
    schema = bind.exec_driver_sql("SELECT current_schema()").scalar_one()
    for function in (_tasks_guard(), _receipts_guard(schema), _events_guard()):
        op.execute(function)
    for table, function, events in _TRIGGERS:
        owner = bind.exec_driver_sql(
            f"SELECT relowner FROM pg_class WHERE oid = CAST('{table}' AS regclass)"
        ).scalar_one()
        op.execute(f"DROP TRIGGER IF EXISTS {function} ON {table}")
        op.execute(
            f"CREATE TRIGGER {function} BEFORE {events} ON {table} FOR EACH ROW "
            f"WHEN ({_NOT_OWNER.format(owner=int(owner))}) EXECUTE FUNCTION {function}()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, function, _ in _TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {function} ON {table}")
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
