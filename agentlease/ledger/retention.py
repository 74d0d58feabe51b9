"""Retention: deleting final tasks older than a cut-off with their evidence, in batches that each re-check it
(``agentlease purge``; ``docs/security-data.md``, "Retention and redaction")."""

from __future__ import annotations

from dataclasses import astuple, dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, exists, func, select
from sqlalchemy.engine import Connection

from agentlease.clock import to_ms
from agentlease.enums import TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import EVENTS as _E
from agentlease.ledger.tables import RECEIPTS as _R
from agentlease.ledger.tables import TASKS as _T
from agentlease.limits import is_decimal

DEFAULT_BATCH_SIZE = 500
"""Tasks one purge transaction deletes at most. Default 500."""

MAX_BATCH_SIZE = 10_000
"""The largest batch: its task ids are bound parameters of one statement (PostgreSQL takes 32,767)."""

_FINAL = sorted(s.value for s in TaskStatus if s.is_terminal and s is not TaskStatus.CANCELLED_EFFECT_UNKNOWN)


@dataclass(frozen=True)
class PurgeCounts:
    """What a purge deleted (or, in a dry run, would delete).

    Attributes:
        tasks / events / receipts / batches: rows of each table; transactions it took (0 in a dry run).
    """

    tasks: int = 0
    events: int = 0
    receipts: int = 0
    batches: int = 0


_OTHER = _T.alias("other")
_OWNER = _T.alias("owner")


def _old(cutoff_ms: int) -> Any:
    return (_T.c.status.in_(_FINAL)) & (_T.c.updated_at_ms < cutoff_ms)


def _unclaimed_receipt() -> Any:
    """A receipt no open task needs: its own run has no open task, and no open task names its key."""
    run_open = exists().where(
        _OWNER.c.task_id == _R.c.task_id, _OTHER.c.agent_run_id == _OWNER.c.agent_run_id, _OTHER.c.status.not_in(_FINAL)
    )
    key_open = exists().where(_OTHER.c.idempotency_key == _R.c.idempotency_key, _OTHER.c.status.not_in(_FINAL))
    return ~run_open & ~key_open


async def purge(
    ledger: Ledger,
    older_than: timedelta,
    *,
    keep_receipts: bool = False,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> PurgeCounts:
    """Delete final tasks whose last change is older than ``older_than`` (ledger clock), with their evidence.

    Args:
        keep_receipts: keep the purged tasks' receipts (their keys stay deduplicated). Default false.
        dry_run: count only. Default false.
        batch_size: tasks per transaction (keyset batches by task id). Default 500.

    Raises:
        ValueError: ``older_than`` not positive, or ``batch_size`` not from 1 to :data:`MAX_BATCH_SIZE`.
        LedgerUnavailableError: the ledger could not be reached (batches already done stay done).
    """
    if older_than <= timedelta(0):
        raise ValueError("the age must be positive")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"the batch size is from 1 to {MAX_BATCH_SIZE} tasks")
    cutoff_ms = to_ms(await ledger.db_now()) - int(older_than.total_seconds() * 1000)
    if dry_run:
        return await ledger.database.read(lambda conn: _count(conn, cutoff_ms, keep_receipts))
    total = PurgeCounts()
    after = ""
    while True:

        def batch(conn: Connection, after: str = after) -> tuple[PurgeCounts, str | None]:
            query = (
                select(_T.c.task_id)
                .where(_old(cutoff_ms) & (_T.c.task_id > after))
                .order_by(_T.c.task_id)
                .limit(batch_size)
            )
            if conn.dialect.name == "postgresql":
                query = query.with_for_update(skip_locked=True)  # rows a lease write holds wait for the next run
            ids = list(conn.execute(query).scalars())
            if not ids:
                return PurgeCounts(), None
            events = conn.execute(delete(_E).where(_E.c.task_id.in_(ids))).rowcount
            receipts = (
                0
                if keep_receipts
                else conn.execute(delete(_R).where(_R.c.task_id.in_(ids) & _unclaimed_receipt())).rowcount
            )
            tasks = conn.execute(delete(_T).where(_T.c.task_id.in_(ids) & _old(cutoff_ms))).rowcount
            return PurgeCounts(tasks, events, receipts, 1), ids[-1]

        done, last = await ledger.database.write(batch)
        if last is None:
            return total
        total = PurgeCounts(*(a + b for a, b in zip(astuple(total), astuple(done), strict=True)))
        after = last


def _count(conn: Connection, cutoff_ms: int, keep_receipts: bool) -> PurgeCounts:
    old_ids = select(_T.c.task_id).where(_old(cutoff_ms))
    tasks = conn.execute(select(func.count()).select_from(_T).where(_old(cutoff_ms))).scalar_one()
    events = conn.execute(select(func.count()).select_from(_E).where(_E.c.task_id.in_(old_ids))).scalar_one()
    receipts = (
        0
        if keep_receipts
        else conn.execute(
            select(func.count()).select_from(_R).where(_R.c.task_id.in_(old_ids) & _unclaimed_receipt())
        ).scalar_one()
    )
    return PurgeCounts(tasks, events, receipts, 0)


MAX_AGE_S = 1000 * 365 * 86400
"""The longest age :func:`parse_age` takes: 1,000 years (a ledger's clock starts in 1970)."""


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or ``2w`` as a duration, at most :data:`MAX_AGE_S`.

    Raises:
        ValueError: anything else, not positive, or longer.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    if unit not in units or not is_decimal(number) or not number.strip("0"):
        raise ValueError(f"bad age {text!r}: a positive whole number and a unit s, m, h, d or w (30d)")
    if len(number) > 15 or int(number) * units[unit] > MAX_AGE_S:
        raise ValueError(f"bad age {text!r}: at most {MAX_AGE_S // (365 * 86400)} years")
    return timedelta(seconds=int(number) * units[unit])
