"""Signed decisions applied once: each decision id recorded with the Temporal activity that first used it; the
same id sent again elsewhere is a replay, refused and recorded once (``docs/security-operations.md``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.engine import Connection

from agentlease.clock import from_ms, now_param
from agentlease.enums import EventKind
from agentlease.ledger.rendering import dialect_insert
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import DECISION_REPLAYS as _REPLAYS
from agentlease.ledger.tables import DECISIONS_APPLIED as _APPLIED
from agentlease.ledger.trail import write_event
from agentlease.records import TaskSpec, TraceLink


@dataclass(frozen=True)
class DecisionUse:
    """One use of a signed decision's id on one task.

    Attributes:
        decision_id / task_id / kind / operator: the id, its task, the decision and who signed it.
        generation: the generation it was signed for (``None``: not bound).
        workflow_id / run_id / activity_id: the Temporal activity that used it (``None``: outside one).
        at_ms: when, on the ledger's clock.
    """

    decision_id: str
    task_id: str
    kind: str
    operator: str
    generation: int | None
    workflow_id: str | None
    run_id: str | None
    activity_id: str | None
    at_ms: int = 0

    def same_activity(self, other: DecisionUse) -> bool:
        """Whether ``other`` is this use again: the same scheduled activity (a Temporal retry; never outside one)."""
        if self.activity_id is None or self.run_id is None:
            return False
        return (self.workflow_id, self.run_id, self.activity_id) == (other.workflow_id, other.run_id, other.activity_id)

    def described(self) -> str:
        """When and by which activity it was used, for a refusal."""
        at = from_ms(self.at_ms).isoformat() if self.at_ms else "earlier"
        where = f" by activity {self.activity_id} of run {self.run_id}" if self.activity_id else ""
        return f"at {at}{where}"

    def values(self) -> dict[str, Any]:
        """The row's columns but its time."""
        values = asdict(self)
        del values["at_ms"]
        return values


def _insert_new(dialect: str, table: Table) -> Any:
    """``INSERT ... ON CONFLICT (decision_id, task_id) DO NOTHING`` (INSERT privilege only)."""
    return dialect_insert(dialect)(table).on_conflict_do_nothing(index_elements=["decision_id", "task_id"])


def _use(row: Any, at: str) -> DecisionUse:
    named = {field.name: getattr(row, field.name) for field in fields(DecisionUse) if field.name != "at_ms"}
    return DecisionUse(**named, at_ms=getattr(row, at))


@dataclass(frozen=True)
class Recorded:
    """What :func:`record_decision_id` found.

    Attributes:
        earlier: the use of the id on the task recorded before (``None``: none, recorded now unless ``moved``).
        generation: the task's claim generation in the ledger (0 for a task it has not seen yet).
        moved: the decision was signed for another generation than ``generation``: nothing recorded.
    """

    earlier: DecisionUse | None
    generation: int
    moved: bool = False


async def record_decision_id(ledger: Ledger, use: DecisionUse) -> Recorded:
    """Record in one transaction that ``use``'s decision id is applied to its task, unless it is already (a
    retry, or a replay) or the task is not at ``use.generation`` (``None``: not bound).

    Raises:
        LedgerUnavailableError: the ledger could not be reached.
    """
    sql = ledger.statements
    insert = _insert_new(ledger.database.dialect, _APPLIED)
    earlier_row = select(_APPLIED).where(_APPLIED.c.decision_id == use.decision_id, _APPLIED.c.task_id == use.task_id)

    def record_tx(conn: Connection) -> Recorded:
        task = conn.execute(sql.select_task, {"key_task_id": use.task_id}).first()
        generation = 0 if task is None else int(task.claim_generation)
        row = conn.execute(earlier_row).first()
        if row is not None:
            return Recorded(_use(row, "applied_at_ms"), generation)
        if use.generation is not None and use.generation != generation:
            return Recorded(None, generation, moved=True)
        at_ms = conn.execute(sql.select_now, now_param(None)).scalar_one()
        if conn.execute(insert.values(**use.values(), applied_at_ms=at_ms)).rowcount == 1:
            return Recorded(None, generation)
        return Recorded(_use(conn.execute(earlier_row).one(), "applied_at_ms"), generation)  # a concurrent one

    return await ledger.database.write(record_tx)


async def record_replay(
    ledger: Ledger,
    spec: TaskSpec,
    replay: DecisionUse,
    applied: DecisionUse,
    reason: str,
    *,
    trace: TraceLink | None = None,
) -> bool:
    """Record a refused replay of a signed decision in the task's trail (``decision_refused``), once per
    decision id and task: whether the entry was written now.

    Raises:
        LedgerUnavailableError: the ledger could not be reached.
    """
    sql = ledger.statements
    insert = _insert_new(ledger.database.dialect, _REPLAYS)

    def replay_tx(conn: Connection) -> bool:
        at_ms = conn.execute(sql.select_now, now_param(None)).scalar_one()
        if conn.execute(insert.values(**replay.values(), refused_at_ms=at_ms)).rowcount != 1:
            return False
        task = conn.execute(sql.select_task, {"key_task_id": spec.task_id}).first()
        write_event(
            conn,
            sql,
            task_id=spec.task_id,
            kind=EventKind.DECISION_REFUSED,
            generation=0 if task is None else task.claim_generation,
            at_ms=at_ms,
            stage=None if task is None else task.stage,
            reason=reason,
            details={
                "by": replay.operator,
                "decision": replay.kind,
                "decision_id": replay.decision_id,
                "refused": "replayed",
                "via": "update",
                "applied_at_ms": applied.at_ms,
                "applied_by_activity": applied.activity_id,
                "applied_in_run": applied.run_id,
            },
            trace=trace,
        )
        return True

    return await ledger.database.write(replay_tx)
