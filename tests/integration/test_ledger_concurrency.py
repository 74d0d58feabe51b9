"""Many claimers race on one task; the evidence trail must show one valid lease at a time (G1, G3).

Real database clock here (no injected ``now``): leases are short so that both ways a lease ends
are exercised, an explicit release and a takeover after lapse. Claimers retry at once on
``LeaseHeldError`` (they spin against the ledger; nothing sleeps).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentlease.clock import to_ms
from agentlease.enums import EventKind, SideEffectClass
from agentlease.errors import LeaseHeldError, LeaseLostError
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import Claim, TaskSpec, idempotency_key_for, task_id_for
from tests.eventually import assert_eventually
from tests.lease_trail import LeaseInterval, assert_one_valid_lease_at_a_time

SQLITE_LEASE_TTL = timedelta(milliseconds=100)
PG_LEASE_TTL = timedelta(milliseconds=300)
"""With 16 claimers in one event loop on 2 cores, a winner's release reaches PostgreSQL tens of
milliseconds after its claim statement (more on a loaded CI machine); a short lease would often lapse first and the
release path would go untested."""
PG_CLAIMERS = 16
PG_ROUNDS = 40
SQLITE_PROCESSES = 4
SQLITE_CLAIMERS_PER_PROCESS = 4
SQLITE_TARGET_GENERATION = 40
RACE_DEADLINE_S = 45.0
"""Upper bound of one race; far above its normal duration (about a second)."""


@dataclass(frozen=True)
class Grant:
    """A claim as the claimer saw it, plus how its holder ended it."""

    generation: int
    owner: str
    acquired_ms: int
    expires_ms: int
    released: bool


def make_spec(lease_ttl: timedelta) -> TaskSpec:
    run = f"race-{uuid.uuid4().hex[:12]}"
    return TaskSpec(
        task_id=task_id_for(run, "contended"),
        agent_run_id=run,
        step_id="contended",
        tool="http.get",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=idempotency_key_for(run, "contended"),
        lease_ttl=lease_ttl,
    )


def grant_of(claim: Claim, released: bool) -> Grant:
    return Grant(claim.generation, claim.owner, to_ms(claim.acquired_at), to_ms(claim.expires_at), released)


def check_race(grants: list[Grant], intervals: list[LeaseInterval], final_generation: int) -> None:
    """Every generation 1..n was handed to exactly one claimer, and the trail agrees with the claimers."""
    grants = sorted(grants, key=lambda g: g.generation)
    assert [g.generation for g in grants] == list(range(1, len(grants) + 1)), "a generation was granted twice or lost"
    assert final_generation == len(grants) == len(intervals)
    for grant, interval in zip(grants, intervals, strict=True):
        assert (interval.generation, interval.owner, interval.acquired_ms) == (
            grant.generation,
            grant.owner,
            grant.acquired_ms,
        )
        assert interval.end_ms <= grant.expires_ms
        assert (interval.ended_by == str(EventKind.RELEASED)) == grant.released, (grant, interval)
    ended_by = Counter(interval.ended_by for interval in intervals)
    # Both ways a lease ends were exercised.
    assert ended_by[str(EventKind.RELEASED)] >= 1, ended_by
    assert ended_by["expiry"] >= 1, ended_by


# -- PostgreSQL: 16 claimers in one process, each claim its own transaction ----------------------


@pytest.mark.postgres
async def test_postgres_claimers_race_for_one_task(pg_url: str) -> None:
    ledger = Ledger.from_url(pg_url, pool_size=PG_CLAIMERS + 4)
    spec = make_spec(PG_LEASE_TTL)
    grants: list[Grant] = []
    deadline = time.monotonic() + RACE_DEADLINE_S

    async def attempt(i: int, round_state: dict[str, bool]) -> tuple[Claim, bool] | None:
        """One claim; in a release round the round's first winner gives the task back at once."""
        try:
            claim = await ledger.claim(spec, f"claimer-{i:02d}")
        except LeaseHeldError:
            return None
        if not round_state["release"]:
            return claim, False
        round_state["release"] = False
        try:
            await ledger.release(claim, error_class="retryable", error="503 from upstream")
        except LeaseLostError:
            return claim, False  # the lease lapsed first; the trail must show expiry
        return claim, True

    try:
        await upgrade(ledger.database)
        for round_no in range(PG_ROUNDS):
            round_state = {"release": round_no % 2 == 0}
            while True:
                assert time.monotonic() < deadline, f"round {round_no} found no winner in time"
                results = await asyncio.gather(*(attempt(i, round_state) for i in range(PG_CLAIMERS)))
                wins = sorted((r for r in results if r is not None), key=lambda r: r[0].generation)
                if wins:
                    break
            # Several wins in one round: the task was released, or a lease lapsed while claims
            # queued. Every earlier holder that did not release has been superseded.
            for claim, released in wins[:-1]:
                if not released:
                    with pytest.raises(LeaseLostError):
                        await ledger.release(claim, error_class="retryable", error="superseded")
            grants.extend(grant_of(claim, released) for claim, released in wins)
        events = await ledger.events(spec.task_id)
        final = await ledger.get_task(spec.task_id)
    finally:
        await ledger.close()

    intervals = assert_one_valid_lease_at_a_time(events)
    check_race(grants, intervals, final.claim_generation)
    assert final.attempts == final.claim_generation
    takeovers = [e for e in events if e.kind == EventKind.EXPIRED]
    assert len(takeovers) == sum(1 for i in intervals[:-1] if i.ended_by == "expiry")


# -- SQLite: several OS processes share one ledger file ------------------------------------------


async def _claim_until(url: str, spec: TaskSpec, process_no: int) -> list[Grant]:
    ledger = Ledger.from_url(url)
    deadline = time.monotonic() + RACE_DEADLINE_S

    async def claimer(owner: str) -> list[Grant]:
        mine: list[Grant] = []
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{owner}: generation {SQLITE_TARGET_GENERATION} not reached in time")
            try:
                claim = await ledger.claim(spec, owner)
            except LeaseHeldError as held:
                if held.generation >= SQLITE_TARGET_GENERATION:
                    return mine
                continue
            released = False
            if claim.generation % 2:
                try:
                    await ledger.release(claim, error_class="retryable", error="503 from upstream")
                    released = True
                except LeaseLostError:
                    pass
            mine.append(grant_of(claim, released))
            if claim.generation >= SQLITE_TARGET_GENERATION:
                return mine

    try:
        per_claimer = await asyncio.gather(
            *(claimer(f"p{process_no}-c{i}") for i in range(SQLITE_CLAIMERS_PER_PROCESS))
        )
    finally:
        await ledger.close()
    return [grant for grants in per_claimer for grant in grants]


def _sqlite_race_process(url: str, spec_json: str, process_no: int, start: Any, results: Any) -> None:
    """Entry point of one spawned process: wait for the others, race, report grants or the error."""
    try:
        spec = TaskSpec.model_validate_json(spec_json)
        start.wait(timeout=RACE_DEADLINE_S)
        results.put((process_no, asyncio.run(_claim_until(url, spec, process_no)), None))
    except BaseException:  # report everything to the parent; it fails the test
        results.put((process_no, [], traceback.format_exc()))


def _run_sqlite_race(url: str, spec: TaskSpec) -> list[Grant]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(SQLITE_PROCESSES)
    results = ctx.Queue()
    processes = [
        ctx.Process(target=_sqlite_race_process, args=(url, spec.model_dump_json(), n, start, results))
        for n in range(SQLITE_PROCESSES)
    ]
    for process in processes:
        process.start()
    grants: list[Grant] = []
    errors: list[str] = []
    reported: set[int] = set()
    exited_silently: set[int] = set()
    give_up = time.monotonic() + RACE_DEADLINE_S + 30
    try:
        while len(reported) < len(processes):
            try:
                process_no, process_grants, error = results.get(timeout=0.2)
            except queue.Empty:
                # A process that had already exited at the previous empty poll will never report.
                dead = {n for n, p in enumerate(processes) if p.exitcode is not None} - reported
                assert not dead & exited_silently, f"processes {sorted(dead)} exited without reporting"
                exited_silently = dead
                assert time.monotonic() < give_up, f"only processes {sorted(reported)} reported in time"
                continue
            reported.add(process_no)
            grants.extend(process_grants)
            if error:
                errors.append(error)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        exit_codes = [process.exitcode for process in processes]
        for process in processes:
            process.close()
        results.close()
        results.join_thread()
    assert not errors, "\n".join(errors)
    assert exit_codes == [0] * SQLITE_PROCESSES, exit_codes
    return grants


async def test_sqlite_processes_race_for_one_task(sqlite_url: str) -> None:
    ledger = Ledger.from_url(sqlite_url)
    spec = make_spec(SQLITE_LEASE_TTL)
    try:
        await upgrade(ledger.database)
        grants = await asyncio.to_thread(_run_sqlite_race, sqlite_url, spec)
        events = await ledger.events(spec.task_id)
        final = await ledger.get_task(spec.task_id)
    finally:
        await ledger.close()

    intervals = assert_one_valid_lease_at_a_time(events)
    assert final.claim_generation >= SQLITE_TARGET_GENERATION
    check_race(grants, intervals, final.claim_generation)
    owners = {grant.owner.split("-")[0] for grant in grants}
    assert len(owners) > 1, f"only one process ever won: {owners}"


async def test_postgres_lease_held_retry_after_is_measured_after_the_row_lock(pg_url: str) -> None:
    """A claim that waited for the task's row lock reports the time left when it was refused, not
    the time left when it started waiting."""
    ledger = Ledger.from_url(pg_url)
    spec = make_spec(timedelta(seconds=60))
    try:
        await upgrade(ledger.database)
        await ledger.claim(spec, "holder")
        locker = await asyncpg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(False))
        try:
            lock = locker.transaction()
            await lock.start()
            await locker.execute("SELECT 1 FROM tasks WHERE task_id = $1 FOR UPDATE", spec.task_id)
            locked_at = await locker.fetchval("SELECT clock_timestamp()")
            claim = asyncio.ensure_future(ledger.claim(spec, "claimer"))

            async def claimer_waited_a_second() -> None:
                waiting = await locker.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                assert waiting == 1
                assert await locker.fetchval("SELECT clock_timestamp()") - locked_at >= timedelta(seconds=1)

            await assert_eventually(claimer_waited_a_second, timeout=20, message="the claim waits on the row lock")
            released_at = await locker.fetchval("SELECT clock_timestamp()")
            await lock.commit()
        finally:
            await locker.close()
        with pytest.raises(LeaseHeldError) as refused:
            await asyncio.wait_for(claim, timeout=20)
        record = await ledger.get_task(spec.task_id)
    finally:
        await ledger.close()
    assert record.lease_owner == "holder" and record.lease_expires_at is not None
    assert timedelta(0) < refused.value.retry_after <= record.lease_expires_at - released_at
