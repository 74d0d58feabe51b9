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
    "MIN_RETRY_DELAY",
    "failure_retry_delay",
    "ledger_retry_delay",
]
