"""A lease write described once (:class:`LeaseWrite`), rendered for both dialects (:func:`render`;
``docs/guarantees.md``, "One description per lease write")."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Insert,
    Select,
    String,
    Update,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    null,
    select,
    true,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from agentlease.clock import bound_now_ms
from agentlease.enums import EventKind
from agentlease.ledger.compiled import execute, row_type
from agentlease.ledger.tables import EVENTS, RECEIPTS, TASKS
from agentlease.records import TraceLink

_E = EVENTS.c
TRACE_COLUMNS = tuple(TraceLink().columns())  # of a task row and of an evidence entry
EVENT_REASON = bindparam("event_reason", type_=_E.reason.type)  # the reason of the entry a lease write makes
EVENT_DETAILS = bindparam("event_details", type_=_E.details.type)  # its details (JSON; SQL may add to them)
RECEIPT = bindparam("receipt", type_=RECEIPTS.c.receipt.type)  # the receipt a settle or a confirm stores

RECEIPT_COLUMNS = {
    "receipt_task_id": RECEIPTS.c.task_id,
    "receipt_generation": RECEIPTS.c.claim_generation,
    "stored_receipt": RECEIPTS.c.receipt,
    "receipt_tool": RECEIPTS.c.tool,
    "receipt_arguments_sha256": RECEIPTS.c.arguments_sha256,
}
"""The receipt stored for a key, as a lease write's caller reads it: label -> column."""

Made = Callable[[Any], Insert]
"""A row made from the changed row: ``changed`` (a CTE or the row read again, with ``.c``) -> INSERT ... SELECT."""


@dataclass(frozen=True)
class LeaseWrite:
    """One lease operation's write.

    Attributes:
        change: the conditional statement, RETURNING the changed row's columns ``made`` and the caller read.
        key: finds the changed row again after the change (``tasks.task_id = :held_task_id``).
        made: the rows made from the changed row, in order: evidence entries, a receipt.
        reads_receipt: the receipt stored for the changed row's key comes back beside it (:data:`RECEIPT_COLUMNS`).
        receipt_first: a settle's guard: the bound ``receipt`` is stored from the guarded row first unless one
            stands, and ``change`` sets the task's ``receipt`` to the one that stands (returned).
    """

    change: Update | Insert
    key: ColumnElement[bool]
    made: tuple[Made, ...] = ()
    reads_receipt: bool = False
    receipt_first: ColumnElement[bool] | None = None


@dataclass(frozen=True)
class Rendered:
    """A :class:`LeaseWrite` as a dialect runs it.

    Attributes:
        statement: PostgreSQL: the whole write sent alone; ``None`` on SQLite and for a write inside a transaction.
        first: a settle's receipt, stored unless one stands (RETURNING :data:`RECEIPT_COLUMNS`).
        change: the conditional statement.
        made: the made rows' ``INSERT ... SELECT`` over the changed row read again by its key.
        result: ``SELECT`` of the receipt stored for the changed row's key (:data:`RECEIPT_COLUMNS`).
    """

    statement: Select[Any] | None
    first: Insert | None
    change: Update | Insert
    made: tuple[Insert, ...]
    result: Select[Any] | None
    _joined: dict[tuple[str, ...], type] = field(default_factory=dict, compare=False, repr=False)

    def run(self, conn: Connection, params: Mapping[str, Any]) -> list[Any]:
        """The write inside ``conn``'s transaction: its rows (none: refused), the change's ``RETURNING`` columns
        and the receipt's (:data:`RECEIPT_COLUMNS`) for a write that reads it."""
        stored = execute(conn, self.first, params) if self.first is not None else []
        rows = execute(conn, self.change, params)
        return self.finish(conn, rows, params, stored) if rows else rows

    def finish(
        self, conn: Connection, rows: list[Any], params: Mapping[str, Any], stored: Sequence[Any] = ()
    ) -> list[Any]:
        """After a change that changed its row (``rows``): make the rows made from it and read the receipt
        (unless the write ``stored`` its own); returns as :meth:`run`."""
        for made in self.made:
            execute(conn, made, params)
        if stored:
            names = (*stored[0]._fields, "stored_receipt")
            return [self._join(rows[0], names, (*stored[0], params["receipt"]))]
        if self.result is None:
            return rows
        [receipt] = execute(conn, self.result, params)
        return [self._join(rows[0], receipt._fields, receipt)]

    def _join(self, row: Any, names: tuple[str, ...], values: Sequence[Any]) -> Any:
        fields = (*row._fields, *names)
        joined = self._joined.get(fields)
        if joined is None:
            joined = self._joined[fields] = row_type(list(fields))
        return joined(*row, *values)


def render(write: LeaseWrite, dialect: str, *, alone: bool = True) -> Rendered:
    """``write`` for ``sqlite`` or ``postgresql``; ``alone=False``: it only runs inside a longer transaction
    (no one-statement form)."""
    changed = select(TASKS).where(write.key).subquery("changed")
    change, first, result = write.change, None, None
    if write.reads_receipt or write.receipt_first is not None:
        result = select(*receipt_columns(_stored)).select_from(_with_receipt(changed))
    if write.receipt_first is not None:
        first = _store_receipt(dialect, _guarded(write.receipt_first).subquery("guarded"), standing=False)
        stands = RECEIPTS.c.idempotency_key == TASKS.c.idempotency_key
        change = change.values(receipt=select(RECEIPTS.c.receipt).where(stands).scalar_subquery())
    statement = _one_statement(write, dialect) if alone and dialect == "postgresql" else None
    made = tuple(build(changed) for build in write.made)
    return Rendered(statement, first, change, made, result)


_stored = RECEIPTS.alias("stored")


def receipt_columns(receipts: Any, *, without: str = "") -> list[ColumnElement[Any]]:
    """``receipts``' columns as a lease write's caller reads them (:data:`RECEIPT_COLUMNS`), but ``without``."""
    return [receipts.c[column.name].label(label) for label, column in RECEIPT_COLUMNS.items() if label != without]


def _with_receipt(changed: Any) -> Any:
    return changed.outerjoin(_stored, _stored.c.idempotency_key == changed.c.idempotency_key)


def _guarded(guard: ColumnElement[bool]) -> Select[Any]:
    """The row a settle's guard holds, locked on PostgreSQL until the statement's transaction ends."""
    columns = (TASKS.c.task_id, TASKS.c.claim_generation, TASKS.c.idempotency_key, TASKS.c.tool)
    return select(*columns, TASKS.c.arguments_sha256).where(guard).with_for_update(of=TASKS)


def _store_receipt(dialect: str, guarded: Any, *, standing: bool) -> Insert:
    """Store the guarded row's receipt unless one stands; RETURNING the standing one (``DO UPDATE`` of the key to
    itself) when ``standing``, else, if stored, its columns but the receipt."""
    stored: Any = receipt_from(dialect, guarded, generation=guarded.c.claim_generation, at_ms=bound_now_ms(dialect))
    key = ["idempotency_key"]
    if standing:
        upsert = stored.on_conflict_do_update(index_elements=key, set_={key[0]: stored.excluded.idempotency_key})
        return upsert.returning(*receipt_columns(RECEIPTS))
    return stored.on_conflict_do_nothing(index_elements=key).returning(
        *receipt_columns(RECEIPTS, without="stored_receipt")
    )


def _one_statement(write: LeaseWrite, dialect: str) -> Select[Any]:
    """PostgreSQL: the change, the rows made from it and what the caller reads, in one statement."""
    change, standing = write.change, None
    if write.receipt_first is not None:
        standing = _store_receipt(dialect, _guarded(write.receipt_first).cte("guarded"), standing=True).cte("standing")
        change = change.values(receipt=select(standing.c.stored_receipt).scalar_subquery())
    changed = change.cte("changed")
    made = [build(changed).cte(f"made_{index}") for index, build in enumerate(write.made)]
    query = select(changed)
    if write.reads_receipt:
        query = select(changed, *receipt_columns(_stored)).select_from(_with_receipt(changed))
    if standing is not None:  # the receipt comes back only when another attempt's stands: the caller has its own
        own = and_(
            standing.c.receipt_task_id == changed.c.task_id,
            standing.c.receipt_generation == changed.c.claim_generation,
        )
        others = case((own, null()), else_=standing.c.stored_receipt).label("stored_receipt")
        columns = [column if column.key != "stored_receipt" else others for column in standing.c]
        query = select(changed, *columns).select_from(changed.join(standing, true()))
    return query.add_cte(*made)


def dialect_insert(dialect: str) -> Any:
    """The dialect's INSERT, with its ``ON CONFLICT`` clauses."""
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise ValueError(f"unsupported ledger dialect {dialect!r}")


def receipt_from(dialect: str, source: Any, *, generation: Any, at_ms: Any) -> Insert:
    """INSERT ... SELECT of the bound ``receipt`` for ``source``'s key, task, tool and arguments; the caller adds
    its ``ON CONFLICT`` clause (the first receipt of a key stands)."""
    values = select(
        source.c.idempotency_key, source.c.task_id, generation, RECEIPT, at_ms, source.c.tool, source.c.arguments_sha256
    ).where(true())  # SQLite: an upsert's SELECT needs a WHERE, or its ON reads as a join's
    columns = ["idempotency_key", "task_id", "claim_generation", "receipt", "created_at_ms", "tool", "arguments_sha256"]
    return dialect_insert(dialect)(RECEIPTS).from_select(columns, values)


def evidence(
    dialect: str, changed: Any, kind: EventKind | ColumnElement[Any], *, owner: Any, details: Any = EVENT_DETAILS
) -> Insert:
    """INSERT ... SELECT of one evidence entry of the changed row, with ``kind`` (an
    :class:`~agentlease.enums.EventKind` or SQL), ``owner`` and ``details`` (SQL); reason and trace are bound."""
    trace = [bindparam(f"event_{column}", type_=_E[column].type) for column in TRACE_COLUMNS]
    columns = ["task_id", "kind", "claim_generation", "lease_owner", "stage", "reason", "details", "at_ms"]
    return insert(EVENTS).from_select(
        [*columns, *TRACE_COLUMNS, "authenticated_as"],
        select(
            changed.c.task_id,
            literal(kind.value, _E.kind.type) if isinstance(kind, EventKind) else kind,
            changed.c.claim_generation,
            owner,
            changed.c.stage,
            EVENT_REASON,
            details,
            changed.c.updated_at_ms,
            *trace,
            authenticated_as(dialect),
        ).select_from(changed),
    )


def authenticated_as(dialect: str) -> ColumnElement[Any]:
    """The role the writer authenticated as: ``session_user`` on PostgreSQL, ``NULL`` on SQLite."""
    if dialect == "postgresql":
        return sql_cast(func.session_user(), _E.authenticated_as.type)
    return null()


def json_with(dialect: str, base: ColumnElement[Any], **fields: ColumnElement[Any] | str) -> ColumnElement[Any]:
    """The JSON object ``base`` with ``fields`` added (a ``str`` is a constant)."""
    pairs: list[Any] = []
    for name, value in fields.items():
        pairs += [literal(name, String), literal(value, String) if isinstance(value, str) else value]
    if dialect == "postgresql":
        merged = sql_cast(base, postgresql.JSONB).op("||")(func.jsonb_build_object(*pairs))
        return sql_cast(merged, JSON)
    return func.json_patch(base, func.json_object(*pairs), type_=JSON)


def event_params(reason: str, details: dict[str, Any] | None, trace: TraceLink) -> dict[str, Any]:
    """The bound parameters of the entry a lease write makes: its reason, details and trace."""
    return {"event_reason": reason, "event_details": details, **trace_params(trace)[1]}


@functools.lru_cache(maxsize=1024)
def trace_params(trace: TraceLink) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The ``trace_*`` columns of ``trace`` as a row's parameters, and as its entry's (``event_trace_*``): made
    once per attempt's trace for its claim, renewals and settle (shared: read, never change them)."""
    columns = trace.columns()
    return columns, {f"event_{name}": value for name, value in columns.items()}
