"""One description, one behaviour: random lease operations give the same outcomes on SQLite and PostgreSQL.

Every lease write is described once (``agentlease/ledger/writes.py``) and rendered per dialect:
PostgreSQL's one statement, SQLite's statements one after another. Hypothesis draws sequences of
claims (with and without a shortened heartbeat timeout, of an approval-gated task too), renewals,
settles, releases, dead letters, parks, sweeper expiries, decisions and clock jumps, on injected
time (no sleeps), and runs each sequence on a SQLite and a PostgreSQL ledger. What every call
returned or raised, and afterwards every task's row, evidence trail and receipt, must be the same
on both (the database's ``authenticated_as`` and ``event_id`` aside).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlease.enums import DecisionKind, ErrorClass, SideEffectClass, Stage, TaskStatus
from agentlease.errors import AgentLeaseError, TaskNotFoundError
from agentlease.ledger.expiry import SWEEPER_STATUSES, expired_leases, record_expiry
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import Claim, SettlementReceipt, TaskSpec, idempotency_key_for, task_id_for

BASE = datetime(2032, 5, 1, 9, 0, tzinfo=UTC)
TTL = timedelta(seconds=10)
TASKS = {  # step -> (side-effect class, approval TTL)
    "fetch": (SideEffectClass.IDEMPOTENT, None),
    "send": (SideEffectClass.UNSAFE, None),
    "refund": (SideEffectClass.UNSAFE, timedelta(seconds=30)),
}
OWNERS = ("w1", "w2")
STAGES = (None, Stage.PREFLIGHT, Stage.EXTERNAL_CALL, Stage.COMMIT, Stage.VERIFY)
DECIDED = (*DecisionKind, DecisionKind.AWAIT_APPROVAL, DecisionKind.APPROVE)
"""Every decision; those that let the approval-gated task run more often."""
PARKED = (TaskStatus.NEEDS_RECONCILIATION, TaskStatus.BLOCKED)
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

steps = st.sampled_from(sorted(TASKS))
held = st.integers(min_value=0, max_value=7)  # which granted claim (the latest first)
claim = st.tuples(st.just("claim"), steps, st.sampled_from(OWNERS), st.sampled_from([None, 4, 30]))
renew = st.tuples(st.just("renew"), held, st.sampled_from(STAGES), st.sampled_from([None, 3]))
decide = st.tuples(st.just("decide"), steps, st.sampled_from(DECIDED))
cancel_send = st.tuples(st.just("decide"), st.just("send"), st.just(DecisionKind.CANCEL))  # its effect may be unknown
later = st.tuples(st.just("later"), st.integers(min_value=1, max_value=12_000))
operations = st.tuples(
    st.sampled_from(STAGES),
    st.lists(
        st.one_of(
            claim,
            claim,
            renew,
            renew,
            st.tuples(st.just("settle"), held),
            st.tuples(st.just("release"), held, st.sampled_from([ErrorClass.RETRYABLE, ErrorClass.SHUTDOWN])),
            st.tuples(st.just("dead_letter"), held),
            st.tuples(st.just("park"), held, st.sampled_from(PARKED)),
            st.tuples(st.just("sweep"), st.sampled_from(sorted(SWEEPER_STATUSES))),
            decide,
            decide,
            cancel_send,
            later,
            later,
        ),
        min_size=5,
        max_size=30,
    ),
).map(
    # Every sequence starts with both ungated tasks claimed and the unsafe one renewed into a drawn stage.
    lambda drawn: [
        ("claim", "fetch", "w1", None),
        ("claim", "send", "w2", None),
        ("renew", 0, drawn[0], None),
        *drawn[1],
    ]
)


def spec_for(run: str, step: str) -> TaskSpec:
    cls, approval_ttl = TASKS[step]
    return TaskSpec(
        task_id=task_id_for(run, step),
        agent_run_id=run,
        step_id=step,
        tool=f"tool.{step}",
        side_effect_class=cls,
        idempotency_key=idempotency_key_for(run, step),
        lease_ttl=TTL,
        approval_ttl=approval_ttl,
    )


def receipt(now: datetime) -> SettlementReceipt:
    return SettlementReceipt(external_system="x", external_id="1", status="present", verified_at=now)


def shown(value: Any) -> Any:
    """What a call returned, comparable across databases (a claim without its random lease token)."""
    if isinstance(value, Claim):
        return value.model_dump(exclude={"lease_token"})
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return value


async def run_operations(url: str, run: str, ops: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``ops`` on the ledger at ``url``: what each returned or raised, then every task's row, trail and receipt."""
    ledger = Ledger.from_url(url)
    now, granted, seen = BASE, list[Claim](), list[Any]()
    specs = {step: spec_for(run, step) for step in TASKS}
    try:
        for op, *args in ops:
            try:
                seen.append((op, shown(await apply(ledger, op, args, specs, granted, now))))
            except AgentLeaseError as exc:
                seen.append((op, type(exc).__name__, str(exc)))
            if op == "later":
                now += timedelta(milliseconds=args[0])
        for step, spec in specs.items():
            try:
                task: Any = await ledger.get_task(spec.task_id)
            except TaskNotFoundError:
                task = None  # never claimed nor decided
            trail = [e.model_dump(exclude={"event_id", "authenticated_as"}) for e in await ledger.events(spec.task_id)]
            seen.append((step, shown(task), trail, shown(await ledger.receipt(spec.idempotency_key))))
    finally:
        await ledger.close()
    return seen


async def apply(
    ledger: Ledger, op: str, args: list[Any], specs: dict[str, TaskSpec], granted: list[Claim], now: datetime
) -> Any:
    """One operation at ``now``; a holder write names one of the claims granted so far (the latest first)."""
    if op == "claim":
        step, owner, timeout_s = args
        timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
        claim = await ledger.claim(specs[step], owner, heartbeat_timeout=timeout, now=now)
        granted.insert(0, claim)
        return claim
    if op == "sweep":
        ours = {spec.task_id for spec in specs.values()}
        leases = [lease for lease in await expired_leases(ledger, limit=1000, now=now) if lease.task_id in ours]
        return [await record_expiry(ledger, lease, status=args[0], decision="test", now=now) for lease in leases]
    if op == "decide":
        step, kind = args
        settles = kind in (DecisionKind.CONFIRM, DecisionKind.CONFIRM_EFFECT)
        return await ledger.decide(
            specs[step].task_id,
            kind,
            by="operator",
            reason=f"{kind.value} in a test",
            details={"note": "drawn"},
            receipt=receipt(now) if settles else None,
            spec=specs[step],
            now=now,
        )
    if op == "later":
        return None
    if not granted:
        return "no claim yet"
    claim = granted[args[0] % len(granted)]
    if op == "renew":
        ttl = None if args[2] is None else timedelta(seconds=args[2])
        return await ledger.renew(claim, reason="working", stage=args[1], ttl=ttl, details={"n": 1}, now=now)
    if op == "settle":
        return await ledger.settle(claim, receipt(now), result={"ok": True}, now=now)
    if op == "release":
        await ledger.release(claim, error_class=args[1], error="503 from upstream", now=now)
    elif op == "dead_letter":
        await ledger.dead_letter(claim, error_class=ErrorClass.PERMANENT, error="400", now=now)
    else:
        await ledger.await_decision(claim, status=args[1], error_class=ErrorClass.AMBIGUOUS, error="?", now=now)
    return "ended"


@pytest.fixture
def ledger_urls(sqlite_url: str, pg_url: str) -> Iterator[tuple[str, str]]:
    """A migrated SQLite and PostgreSQL ledger; each example uses runs of its own on both."""

    async def migrate() -> None:
        for url in (sqlite_url, pg_url):
            ledger = Ledger.from_url(url)
            try:
                await upgrade(ledger.database)
            finally:
                await ledger.close()

    asyncio.run(migrate())
    yield sqlite_url, pg_url


@pytest.mark.postgres
def test_random_lease_operations_give_the_same_outcomes_on_both_databases(ledger_urls: tuple[str, str]) -> None:
    examples = itertools.count()

    @SETTINGS
    @given(ops=operations)
    def same_outcomes(ops: list[tuple[Any, ...]]) -> None:
        run = f"dialects-{next(examples)}"
        on_sqlite = asyncio.run(run_operations(ledger_urls[0], run, ops))
        on_postgres = asyncio.run(run_operations(ledger_urls[1], run, ops))
        for sqlite_seen, postgres_seen in zip(on_sqlite, on_postgres, strict=True):
            assert sqlite_seen == postgres_seen

    same_outcomes()
