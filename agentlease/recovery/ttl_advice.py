"""Choosing a lease TTL from observed behaviour: :func:`advise` reads the gaps between a holder's consecutive
writes per tool and stage, and proposes a TTL that covers them with room to spare (``agentlease advise-ttl``,
``docs/ttl.md``). Figures are seconds on the ledger's clock.
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
from agentlease.enums import EventKind, Stage
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import EVENTS, TASKS
from agentlease.limits import is_decimal
from agentlease.observability.metrics import stage_label

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

CAME_BACK = frozenset({EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED})
"""Entries of a holder that wrote after its lease lapsed: it was alive, only quiet for longer than the TTL."""

MIN_GAPS = 20
"""No recommendation for a tool from fewer gaps between holder writes than this. Default 20."""

RECOVERY_BACKOFF_S = 1.0
"""The first retry backoff of a tool call (``RETRY_INITIAL_INTERVAL``), added to the TTL in the recovery estimate."""

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
    """What holders of one tool did in one ``stage`` (``none``: before the first): ``gaps``, quiet time between
    consecutive holder writes (the last ending at a refused write after the lapse); ``durations``, from entering
    the stage to the next (or the attempt's end); ``expiries``, leases that lapsed in it; ``lapsed_alive``, those
    whose holder wrote again after the lapse (:data:`CAME_BACK`)."""

    stage: str
    gaps: Spread
    durations: Spread
    expiries: int
    lapsed_alive: int = 0


@dataclass(frozen=True)
class TtlOption:
    """One TTL and what it costs: ``recovery_after_crash_s``, how long a crashed holder's task waits for another
    attempt (the TTL plus the first retry backoff); ``pause_expiry_chance``, the share of observed gaps at least
    as long as the TTL (how often a quiet spell like those would have cost the lease)."""

    ttl_s: float
    recovery_after_crash_s: float
    pause_expiry_chance: float


@dataclass(frozen=True)
class ToolAdvice:
    """The advice for one tool.

    Attributes:
        current_ttl_s: its lease TTL as recorded on its tasks (the most common one).
        leases: attempts (claims) seen; ``gaps`` over all stages (``gaps.count``: the samples), ``stages`` each.
        recommended_ttl_s: ``max(HEADROOM x p99 gap, MAX_GAP_HEADROOM x longest gap, MIN_TTL_S)``,
            rounded up to a whole second, and never below the current TTL when ``lapsed_alive``;
            ``None`` with fewer than ``min_gaps`` gaps.
        options: the current and the recommended TTL, side by side.
        warnings: one line each; empty when the TTL has room.
    """

    tool: str
    current_ttl_s: float
    leases: int
    gaps: Spread
    stages: list[StageAdvice]
    lapsed_alive: int
    recommended_ttl_s: float | None
    min_gaps: int
    options: list[TtlOption]
    warnings: list[str] = field(default_factory=list)

    @property
    def missing_samples(self) -> int:
        """How many more gaps a recommendation needs (0: it has enough)."""
        return max(0, self.min_gaps - self.gaps.count)


_STAGE_ORDER = ["none", *(stage.value for stage in Stage)]


def _stage_key(stage: str) -> int:
    return _STAGE_ORDER.index(stage) if stage in _STAGE_ORDER else len(_STAGE_ORDER)


def advise(samples: Iterable[EventSample], *, min_gaps: int = MIN_GAPS) -> list[ToolAdvice]:
    """One :class:`ToolAdvice` per tool with a holder write, sorted by tool, from ``samples`` in the order of
    :func:`read_samples` (task, generation, event; other orders give wrong gaps); ``min_gaps`` per recommendation."""
    gaps: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    durations: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    expiries: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    lapsed_alive: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    leases: dict[str, int] = defaultdict(int)
    ttls: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    for attempt in _attempts(samples):
        tool = attempt[0].tool
        ttls[tool][attempt[0].lease_ttl_ms] += 1
        writes = [s for s in attempt if s.kind in HOLDER_WRITES]
        expired = next((s for s in attempt if s.kind is EventKind.EXPIRED), None)
        if expired is not None:
            expiries[tool][stage_label(expired.stage)] += 1
        came_back = next(
            (s for s in attempt if s.kind in CAME_BACK and (not writes or s.at_ms > writes[-1].at_ms)), None
        )
        if expired is not None and came_back is not None:
            lapsed_alive[tool][stage_label(expired.stage)] += 1
        if not writes:
            continue
        leases[tool] += int(any(s.kind is EventKind.CLAIMED for s in writes))
        for before, after in itertools.pairwise(writes):
            gaps[tool][stage_label(before.stage)].append((after.at_ms - before.at_ms) / 1000)
        if came_back is not None:  # the holder's quiet spell ended at its refused write
            gaps[tool][stage_label(writes[-1].stage)].append((came_back.at_ms - writes[-1].at_ms) / 1000)
        entered: list[tuple[str, int]] = []
        for sample in writes:
            if sample.kind not in (EventKind.CLAIMED, EventKind.RENEWED):
                continue  # the write that ends the attempt enters no stage
            label = stage_label(sample.stage)
            if not entered or entered[-1][0] != label:
                entered.append((label, sample.at_ms))
        if not entered:
            continue  # no claim: a refused call recorded on its own task, nothing held
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
        alive = sum(lapsed_alive[tool].values())
        recommended: float | None = None
        if spread.count >= min_gaps:
            recommended = float(math.ceil(max(HEADROOM * spread.p99, MAX_GAP_HEADROOM * spread.max, MIN_TTL_S)))
            if alive:
                recommended = max(recommended, current)
        stages = sorted(
            set(gaps[tool]) | set(durations[tool]) | set(expiries[tool]) | set(lapsed_alive[tool]), key=_stage_key
        )
        advice.append(
            ToolAdvice(
                tool=tool,
                current_ttl_s=current,
                leases=leases[tool],
                gaps=spread,
                stages=[
                    StageAdvice(
                        stage=stage,
                        gaps=Spread.of(gaps[tool][stage]),
                        durations=Spread.of(durations[tool][stage]),
                        expiries=expiries[tool][stage],
                        lapsed_alive=lapsed_alive[tool][stage],
                    )
                    for stage in stages
                ],
                lapsed_alive=alive,
                recommended_ttl_s=recommended,
                min_gaps=min_gaps,
                options=[_option(ttl, all_gaps) for ttl in dict.fromkeys([current, recommended]) if ttl is not None],
                warnings=_warnings(tool, current, spread, lapsed_alive[tool]),
            )
        )
    return advice


def _warnings(tool: str, current_s: float, gaps: Spread, lapsed_alive: dict[str, int]) -> list[str]:
    warnings = []
    alive = {stage: n for stage, n in lapsed_alive.items() if n}
    if alive:
        where = ", ".join(f"{n} in {stage}" for stage, n in sorted(alive.items(), key=lambda item: _stage_key(item[0])))
        warnings.append(
            f"{tool}: {sum(alive.values())} lease(s) lapsed while the holder was alive ({where}): it came back "
            f"after more than {current_s:g}s of quiet, so the TTL is too short for its pauses; never shorten it"
        )
    if gaps.count and max(gaps.p99, gaps.max) >= CLOSE_TO_TTL * current_s:
        warnings.append(
            f"{tool}: holders went quiet for up to {gaps.max:.1f}s (p99 {gaps.p99:.1f}s) "
            f"against a TTL of {current_s:g}s; a pause like those would expire the lease"
        )
    return warnings


def _option(ttl_s: float, gaps: list[float]) -> TtlOption:
    expiring = sum(gap >= ttl_s for gap in gaps)
    return TtlOption(
        ttl_s=ttl_s,
        recovery_after_crash_s=ttl_s + RECOVERY_BACKOFF_S,
        pause_expiry_chance=expiring / len(gaps) if gaps else 0.0,
    )


def _attempts(samples: Iterable[EventSample]) -> Iterator[list[EventSample]]:
    """Consecutive samples of one task and generation: one attempt's lease."""
    for _key, attempt in itertools.groupby(samples, key=lambda sample: (sample.task_id, sample.generation)):
        yield list(attempt)


async def read_samples(
    ledger: Ledger, *, tool: str | None = None, since: datetime | None = None, batch: int = 5_000
) -> list[EventSample]:
    """The evidence entries the advisor reads (of ``tool``, at or after ``since``), ordered by task, generation
    and event, ``batch`` rows a round trip."""
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
    """``--since``: an ISO time, or a duration back from ``now`` (``90s``, ``30m``, ``12h``, ``7d``); else
    ``ValueError``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and is_decimal(text[:-1].replace(".", "", 1)):
        try:
            return now - timedelta(seconds=float(text[:-1]) * units[text[-1]])
        except (OverflowError, ValueError):
            raise ValueError(f"--since {text!r} reaches further back than the calendar goes") from None
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        raise ValueError(f"--since {text!r} has no time zone; add one (Z, +00:00)")
    return parsed
