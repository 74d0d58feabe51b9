"""How soon a tool call is tried again (``docs/recovery.md``, "How fast recovery is"): a lost attempt by Temporal's
retry policy, paced by the lease (``LeaseHeld``); a recorded retryable failure after :func:`failure_retry_delay`
of the task's real attempts (a Temporal reset does not restart the pacing).
"""

from __future__ import annotations

from datetime import timedelta

LOST_ATTEMPT_RETRY_INITIAL = timedelta(milliseconds=200)
"""First backoff of Temporal's retry policy of a tool call. Default 0.2 s."""
LOST_ATTEMPT_RETRY_MAXIMUM = timedelta(seconds=1)
"""Largest backoff of Temporal's retry policy of a tool call. Default 1 s."""

FAILURE_RETRY_INITIAL = timedelta(seconds=1)
"""Delay after a task's first failed real attempt. Default 1 s."""
FAILURE_RETRY_MAXIMUM = timedelta(seconds=30)
"""Largest delay between failed real attempts. Default 30 s."""

LEDGER_RETRY_MAXIMUM = timedelta(seconds=10)
"""Largest delay of an attempt that could not reach the ledger. Default 10 s."""

MIN_RETRY_DELAY = timedelta(milliseconds=20)
"""Smallest ``next_retry_delay`` asked of Temporal."""

MIN_HEARTBEAT_TIMEOUT = timedelta(seconds=2)
"""Shortest heartbeat timeout a tool call is scheduled with (unless its lease TTL is shorter). Default 2 s."""


def heartbeat_timeout_for(lease_ttl: timedelta) -> timedelta:
    """Temporal's heartbeat timeout of a call leased for ``lease_ttl``: a third of it, rounded to the millisecond,
    at least :data:`MIN_HEARTBEAT_TIMEOUT` and at most ``lease_ttl`` (10 s -> 3.333 s, 5 s -> 2 s, 2 s -> 2 s).

    Temporal gives up on a stopped worker's attempt after this timeout, so that an attempt it then hands to another
    stopped worker's open poll times out too before the lease lapses; the attempt heartbeats every third of it,
    and the lease keeps its TTL (``docs/ttl.md``, "How soon another worker takes over").
    """
    third = timedelta(milliseconds=round(lease_ttl / timedelta(milliseconds=1) / 3))
    return min(lease_ttl, max(third, MIN_HEARTBEAT_TIMEOUT))


def failure_retry_delay(real_attempts: int) -> timedelta:
    """``next_retry_delay`` after a retryable failure: 1 s, 2 s, 4 s... doubling per real attempt so far (the failed
    one included), at most 30 s."""
    return _doubling(FAILURE_RETRY_INITIAL, real_attempts, FAILURE_RETRY_MAXIMUM)


def ledger_retry_delay(temporal_attempt: int) -> timedelta:
    """``next_retry_delay`` of an attempt that could not reach the ledger: 1 s doubling per Temporal
    attempt, at most :data:`LEDGER_RETRY_MAXIMUM` (an outage does not count real attempts)."""
    return _doubling(FAILURE_RETRY_INITIAL, temporal_attempt, LEDGER_RETRY_MAXIMUM)


def _doubling(first: timedelta, n: int, most: timedelta) -> timedelta:
    return min(first * 2 ** min(max(n, 1) - 1, 30), most)


__all__ = [
    "FAILURE_RETRY_INITIAL",
    "FAILURE_RETRY_MAXIMUM",
    "LEDGER_RETRY_MAXIMUM",
    "LOST_ATTEMPT_RETRY_INITIAL",
    "LOST_ATTEMPT_RETRY_MAXIMUM",
    "MIN_HEARTBEAT_TIMEOUT",
    "MIN_RETRY_DELAY",
    "failure_retry_delay",
    "heartbeat_timeout_for",
    "ledger_retry_delay",
]
