"""How a leased tool call is scheduled: pure, deterministic, shared by the workflow and its tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

from agentlease.enums import FailureType
from agentlease.errors import MissingHeartbeatTimeoutError
from agentlease.records import ToolInfo
from agentlease.recovery.retries import (
    LOST_ATTEMPT_RETRY_INITIAL,
    LOST_ATTEMPT_RETRY_MAXIMUM,
    heartbeat_timeout_for,
)

RETRY_INITIAL_INTERVAL = LOST_ATTEMPT_RETRY_INITIAL
"""First Temporal retry backoff (a lost attempt; failures the ledger recorded set their own delay)."""
RETRY_MAXIMUM_INTERVAL = LOST_ATTEMPT_RETRY_MAXIMUM
"""Largest Temporal retry backoff: it never grows past what the lease's ``LeaseHeld`` delay paces."""


@dataclass(frozen=True)
class LeasedActivityOptions:
    """Options for ``workflow.execute_activity`` of one tool call."""

    heartbeat_timeout: timedelta
    start_to_close_timeout: timedelta
    retry_policy: RetryPolicy


def leased_activity_options(tool: ToolInfo) -> LeasedActivityOptions:
    """Temporal options of a tool call: a heartbeat timeout made from the lease TTL (G9, :func:`heartbeat_timeout_for`:
    a third of it, at least 2 s), unlimited retries on a short backoff."""
    if tool.lease_ttl is None or tool.lease_ttl <= timedelta(0):
        raise MissingHeartbeatTimeoutError(
            f"tool {tool.name!r} cannot be scheduled without a heartbeat_timeout (its lease TTL)"
        )
    return LeasedActivityOptions(
        heartbeat_timeout=heartbeat_timeout_for(tool.lease_ttl),
        start_to_close_timeout=tool.start_to_close,
        retry_policy=RetryPolicy(
            initial_interval=RETRY_INITIAL_INTERVAL,
            backoff_coefficient=2.0,
            maximum_interval=RETRY_MAXIMUM_INTERVAL,
            maximum_attempts=0,
            non_retryable_error_types=FailureType.non_retryable(),
        ),
    )
