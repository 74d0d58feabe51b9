"""How a leased tool call is scheduled: pure, deterministic, shared by the workflow and its tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

from agentlease.enums import FailureType
from agentlease.errors import MissingHeartbeatTimeoutError
from agentlease.records import ToolInfo

RETRY_INITIAL_INTERVAL = timedelta(seconds=1)
"""First Temporal retry backoff. Default 1s."""
RETRY_MAXIMUM_INTERVAL = timedelta(seconds=30)
"""Largest Temporal retry backoff. Default 30s."""


@dataclass(frozen=True)
class LeasedActivityOptions:
    """Options for ``workflow.execute_activity`` of one tool call."""

    heartbeat_timeout: timedelta
    start_to_close_timeout: timedelta
    retry_policy: RetryPolicy


def leased_activity_options(tool: ToolInfo) -> LeasedActivityOptions:
    """Temporal options of a tool call: heartbeat timeout = lease TTL (G9).

    Temporal retries without an attempt limit: the ledger counts real attempts (refused claims
    while a lease is still held are not attempts) and dead-letters after ``tool.max_attempts``.

    Raises:
        MissingHeartbeatTimeoutError: the tool has no positive lease TTL.
    """
    if tool.lease_ttl is None or tool.lease_ttl <= timedelta(0):
        raise MissingHeartbeatTimeoutError(
            f"tool {tool.name!r} cannot be scheduled without a heartbeat_timeout (its lease TTL)"
        )
    return LeasedActivityOptions(
        heartbeat_timeout=tool.lease_ttl,
        start_to_close_timeout=tool.start_to_close,
        retry_policy=RetryPolicy(
            initial_interval=RETRY_INITIAL_INTERVAL,
            backoff_coefficient=2.0,
            maximum_interval=RETRY_MAXIMUM_INTERVAL,
            maximum_attempts=0,
            non_retryable_error_types=FailureType.non_retryable(),
        ),
    )
