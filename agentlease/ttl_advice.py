"""Choosing a lease TTL from observed behaviour: the renewal history says how long holders go quiet.

A lease TTL trades recovery time against false expiry: after a crash, the next attempt can claim
the task only once the TTL has lapsed; but a holder that goes quiet for longer than the TTL (a slow
downstream, a long GC, a paused VM) loses its lease although it was working. Like Pub/Sub sizing
its lease extensions from the 99th percentile of acknowledgement latency, :func:`advise` reads
the gaps between a holder's consecutive writes (claim, renewals with their stage, settle,
release) per tool and stage, and proposes a TTL that covers them with room to spare.

Figures are seconds on the ledger's clock. See ``docs/ttl.md``.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.engine import Connection

from agentlease.clock import to_ms
from agentlease.enums import EventKind
from agentlease.ledger.statements import EVENTS, TASKS
from agentlease.ledger.store import Ledger
from agentlease.metrics import stage_label

HOLDER_WRITES = frozenset(
    {
        EventKind.CLAIMED,
        EventKind.RENEWED,
        EventKind.SETTLED,
        EventKind.RELEASED,
        EventKind.DEAD_LETTERED,
        EventKind.BLOCKED,
        EventKind.NEEDS_RECONCILIATION,
    }
)
"""Entries a lease holder writes itself: the points between which it was quiet."""

RECOVERY_BACKOFF_S = 1.0
"""The first retry backoff of a tool call (``agentlease.workflow._options.RETRY_INITIAL_INTERVAL``), added to the
TTL in the recovery estimate. Default 1s."""

HEADROOM = 2.0
"""The recommended TTL is at least this many times the 99th-percentile gap. Default 2."""

MAX_GAP_HEADROOM = 1.25
"""... and at least this many times the longest gap seen. Default 1.25."""

MIN_TTL_S = 2.0
"""No recommendation goes below this TTL, in seconds. Default 2."""

CLOSE_TO_TTL = 0.8
"""A tool whose 99th-percentile or longest gap reaches this fraction of its TTL gets a warning."""


@dataclass(frozen=True)
class EventSample:
    """One evidence-trail entry, as the advisor needs it."""

    tool: str
    task_id: str
    generation: int
    kind: EventKind
    stage: str | None
    at_ms: int
    lease_ttl_ms: int


@dataclass(frozen=True)
class Spread:
    """Percentiles of a list of durations, in seconds (nearest-rank)."""

    count: int
    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        ordered = sorted(values)
        if not ordered:
            return cls(0, 0.0, 0.0, 0.0, 0.0)

        def rank(q: float) -> float:
            return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

        return cls(len(ordered), rank(0.50), rank(0.95), rank(0.99), ordered[-1])


@dataclass(frozen=True)
class StageAdvice:
    """What holders of one tool did in one stage.

    Attributes:
        stage: the stage the holder was in during the gap (``none``: before its first stage).
        gaps: quiet time between consecutive holder writes.
        durations: time from entering the stage to entering the next one (or ending the attempt).
        expiries: leases that lapsed in this stage.
    """

    stage: str
    gaps: Spread
    durations: Spread
    expiries: int


@dataclass(frozen=True)
class TtlOption:
    """One TTL and what it costs.

    Attributes:
        ttl_s: the TTL.
        recovery_after_crash_s: how long a crashed holder's task waits before another attempt can
            claim it: the TTL plus the first retry backoff.
        renewals_per_minute: the holders' observed renewal rate per leased minute (it depends on the
            tool's own cadence, not on the TTL: tools renew when they advance or call ``renew``).
        pause_expiry_chance: the share of observed gaps at least as long as this TTL: how often a
            quiet spell like those seen would have cost the holder its lease.
    """

    ttl_s: float
    recovery_after_crash_s: float
    renewals_per_minute: float
    pause_expiry_chance: float


@dataclass(frozen=True)
class ToolAdvice:
    """The advice for one tool.

    Attributes:
        tool: the tool.
        current_ttl_s: its lease TTL as recorded on its tasks (the most common one).
        gaps: quiet time between holder writes over all stages.
        stages: per stage, in stage order.
        recommended_ttl_s: ``max(HEADROOM x p99 gap, MAX_GAP_HEADROOM x longest gap, MIN_TTL_S)``,
            rounded up to a whole second.
        options: the current and the recommended TTL, side by side.
        warnings: one line each; empty when the TTL has room.
    """

    tool: str
    current_ttl_s: float
    gaps: Spread
    stages: list[StageAdvice]
    recommended_ttl_s: float
    options: list[TtlOption]
    warnings: list[str] = field(default_factory=list)


_STAGE_ORDER = ["none", "preflight", "external_call", "commit", "verify", "settled"]


def _stage_key(stage: str) -> int:
    return _STAGE_ORDER.index(stage) if stage in _STAGE_ORDER else len(_STAGE_ORDER)


def advise(samples: Iterable[EventSample]) -> list[ToolAdvice]:
    """The advice per tool from evidence entries ordered by task, generation and time.

    Args:
        samples: entries of the evidence trail, in the order of :func:`read_samples` (task,
            generation, event); other orders give wrong gaps.

    Returns:
        One :class:`ToolAdvice` per tool that has at least one holder write, sorted by tool.
    """
    gaps: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    durations: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    expiries: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    renewals: dict[str, int] = defaultdict(int)
    held_s: dict[str, float] = defaultdict(float)
    ttls: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    for attempt in _attempts(samples):
        tool = attempt[0].tool
        ttls[tool][attempt[0].lease_ttl_ms] += 1
        writes = [s for s in attempt if s.kind in HOLDER_WRITES]
        for sample in attempt:
            if sample.kind is EventKind.EXPIRED:
                expiries[tool][stage_label(sample.stage)] += 1
        if not writes:
            continue
        renewals[tool] += sum(s.kind is EventKind.RENEWED for s in writes)
        held_s[tool] += (writes[-1].at_ms - writes[0].at_ms) / 1000
        for before, after in itertools.pairwise(writes):
            gaps[tool][stage_label(before.stage)].append((after.at_ms - before.at_ms) / 1000)
        entered: list[tuple[str, int]] = []
        for sample in writes:
            if sample.kind not in (EventKind.CLAIMED, EventKind.RENEWED):
                continue  # the write that ends the attempt enters no stage
            label = stage_label(sample.stage)
            if not entered or entered[-1][0] != label:
                entered.append((label, sample.at_ms))
        ends = [at for _, at in entered[1:]] + [writes[-1].at_ms]
        for (label, start), end in zip(entered, ends, strict=True):
            durations[tool][label].append((end - start) / 1000)

    advice = []
    for tool in sorted(ttls):
        all_gaps = [gap for per_stage in gaps[tool].values() for gap in per_stage]
        if not all_gaps and not durations[tool]:
            continue
        current = max(ttls[tool].items(), key=lambda item: item[1])[0] / 1000
        spread = Spread.of(all_gaps)
        recommended = float(math.ceil(max(HEADROOM * spread.p99, MAX_GAP_HEADROOM * spread.max, MIN_TTL_S)))
        rate = 60 * renewals[tool] / held_s[tool] if held_s[tool] > 0 else 0.0
        stages = sorted(set(gaps[tool]) | set(durations[tool]) | set(expiries[tool]), key=_stage_key)
        warnings = []
        if spread.count and max(spread.p99, spread.max) >= CLOSE_TO_TTL * current:
            warnings.append(
                f"{tool}: holders went quiet for up to {spread.max:.1f}s (p99 {spread.p99:.1f}s) "
                f"against a TTL of {current:g}s; a pause like those would expire the lease"
            )
        advice.append(
            ToolAdvice(
                tool=tool,
                current_ttl_s=current,
                gaps=spread,
                stages=[
                    StageAdvice(
                        stage=stage,
                        gaps=Spread.of(gaps[tool][stage]),
                        durations=Spread.of(durations[tool][stage]),
                        expiries=expiries[tool][stage],
                    )
                    for stage in stages
                ],
                recommended_ttl_s=recommended,
                options=[_option(ttl, rate, all_gaps) for ttl in dict.fromkeys([current, recommended])],
                warnings=warnings,
            )
        )
    return advice


def _option(ttl_s: float, renewals_per_minute: float, gaps: list[float]) -> TtlOption:
    expiring = sum(gap >= ttl_s for gap in gaps)
    return TtlOption(
        ttl_s=ttl_s,
        recovery_after_crash_s=ttl_s + RECOVERY_BACKOFF_S,
        renewals_per_minute=renewals_per_minute,
        pause_expiry_chance=expiring / len(gaps) if gaps else 0.0,
    )


def _attempts(samples: Iterable[EventSample]) -> Iterator[list[EventSample]]:
    """Consecutive samples of one task and generation: one attempt's lease."""
    current: list[EventSample] = []
    for sample in samples:
        if current and (sample.task_id, sample.generation) != (current[0].task_id, current[0].generation):
            yield current
            current = []
        current.append(sample)
    if current:
        yield current


async def read_samples(
    ledger: Ledger, *, tool: str | None = None, since: datetime | None = None, batch: int = 5_000
) -> list[EventSample]:
    """The evidence entries the advisor reads, ordered by task, generation and event.

    Args:
        tool: only this tool's tasks.
        since: only entries at or after this time (aware).
        batch: rows fetched per round trip. Default 5,000.
    """
    query = (
        select(
            TASKS.c.tool,
            EVENTS.c.task_id,
            EVENTS.c.claim_generation,
            EVENTS.c.kind,
            EVENTS.c.stage,
            EVENTS.c.at_ms,
            TASKS.c.lease_ttl_ms,
        )
        .join(TASKS, TASKS.c.task_id == EVENTS.c.task_id)
        .order_by(EVENTS.c.task_id, EVENTS.c.claim_generation, EVENTS.c.event_id)
    )
    if tool is not None:
        query = query.where(TASKS.c.tool == tool)
    if since is not None:
        query = query.where(EVENTS.c.at_ms >= to_ms(since))

    def read(conn: Connection) -> list[EventSample]:
        rows = conn.execution_options(yield_per=batch).execute(query)
        return [
            EventSample(
                row.tool, row.task_id, row.claim_generation, EventKind(row.kind), row.stage, row.at_ms, row.lease_ttl_ms
            )
            for row in rows
        ]

    return await ledger.database.read(read)


def since_argument(text: str, now: datetime) -> datetime:
    """``--since``: an ISO time, or a duration back from ``now`` (``90s``, ``30m``, ``12h``, ``7d``).

    Raises:
        ValueError: neither.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return now - timedelta(seconds=float(text[:-1]) * units[text[-1]])
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        raise ValueError(f"--since {text!r} has no time zone; add one (Z, +00:00)")
    return parsed
