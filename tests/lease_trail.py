"""Read G1 and G3 back from the evidence trail of one task.

Each claim generation was valid from its ``claimed`` event (``at``) until the earliest of its
expiry (``lease_expires_at_ms`` of its claim, moved by each renewal) and the event that ended it
(released, settled, dead-lettered, cancelled). G1 holds when these half-open intervals never
overlap; G3 when the claimed generations are exactly 1..n.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from agentlease.clock import to_ms
from agentlease.enums import EventKind
from agentlease.records import LeaseEvent

_ENDS = frozenset({EventKind.RELEASED, EventKind.SETTLED, EventKind.DEAD_LETTERED, EventKind.CANCELLED})
_HOLDER_ENDS = frozenset({EventKind.RELEASED, EventKind.SETTLED, EventKind.DEAD_LETTERED})


@dataclass(frozen=True)
class LeaseInterval:
    """When one claim generation was valid: ``[acquired_ms, end_ms)`` on the ledger's clock."""

    generation: int
    owner: str | None
    acquired_ms: int
    end_ms: int
    ended_by: str
    """The event kind that ended it, or ``"expiry"``."""


def lease_intervals(events: Sequence[LeaseEvent]) -> list[LeaseInterval]:
    """The validity interval of every generation of one task, in generation order.

    Also checks that each renewal and each holder's end (release, settle, dead-letter) happened
    while the lease was valid, and that an ``expired`` event is only written once the lease lapsed.
    """
    task_ids = {event.task_id for event in events}
    assert len(task_ids) <= 1, f"events of several tasks: {task_ids}"
    claimed = [event for event in events if event.kind == EventKind.CLAIMED]
    generations = [event.claim_generation for event in claimed]
    assert generations == sorted(set(generations)), f"claimed generations out of order or repeated: {generations}"

    intervals = []
    for claim in claimed:
        generation = claim.claim_generation
        assert claim.details is not None, f"claimed event without details: {claim}"
        acquired = to_ms(claim.at)
        expiry = claim.details["lease_expires_at_ms"]
        end: int | None = None
        ended_by = "expiry"
        for event in events:
            if event.claim_generation != generation or event.event_id <= claim.event_id:
                continue
            at = to_ms(event.at)
            if event.kind == EventKind.RENEWED:
                assert end is None, f"generation {generation} renewed after it ended: {event}"
                assert acquired <= at < expiry, f"generation {generation} renewed outside its lease: {event}"
                assert event.details is not None
                expiry = event.details["lease_expires_at_ms"]
            elif event.kind == EventKind.EXPIRED:
                assert at >= expiry, f"generation {generation} marked expired at {at} before its expiry {expiry}"
            elif event.kind in _ENDS and end is None:
                if event.kind in _HOLDER_ENDS:
                    assert acquired <= at < expiry, f"generation {generation} ended by its holder after expiry: {event}"
                end = at
                ended_by = str(event.kind)
        if end is None or end > expiry:
            end, ended_by = expiry, "expiry"
        intervals.append(LeaseInterval(generation, claim.lease_owner, acquired, end, ended_by))
    return intervals


def assert_one_valid_lease_at_a_time(events: Sequence[LeaseEvent]) -> list[LeaseInterval]:
    """G1 and G3 on one task's evidence trail; returns the intervals for further checks.

    Raises:
        AssertionError: generations are not exactly 1..n, or two validity intervals overlap.
    """
    intervals = lease_intervals(events)
    generations = [interval.generation for interval in intervals]
    assert generations == list(range(1, len(generations) + 1)), f"generations not 1..n: {generations}"
    for previous, current in itertools.pairwise(intervals):
        assert current.acquired_ms >= previous.end_ms, (
            f"two valid leases: generation {previous.generation} ({previous.owner}) valid "
            f"[{previous.acquired_ms}, {previous.end_ms}) overlaps generation {current.generation} "
            f"({current.owner}) acquired at {current.acquired_ms}"
        )
    return intervals
