"""How soon a tool call is tried again, and the worker settings that bound a takeover (docs/recovery.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.api.workflow.v1 import PendingActivityInfo

from agentlease.enums import ErrorClass, Interruption, SideEffectClass
from agentlease.records import ToolInfo
from agentlease.recovery.retries import failure_retry_delay, heartbeat_timeout_for, ledger_retry_delay
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._binding import ttl_refusal
from agentlease.tools._context import followed_timeout, heartbeat_timeout_of
from agentlease.workflow._options import leased_activity_options


def test_the_backoff_of_a_lost_attempt_never_grows_past_a_second() -> None:
    """A paused worker's open polls each absorb one retry: the policy's backoff must not add up to more
    than the lease already paces (LeaseHeld says the time left)."""
    for ttl in (timedelta(seconds=2), timedelta(minutes=5)):
        info = ToolInfo(
            name="t",
            side_effect_class=SideEffectClass.FENCED,
            lease_ttl=ttl,
            start_to_close=timedelta(minutes=10),
            max_attempts=5,
        )
        policy = leased_activity_options(info).retry_policy
        assert policy.initial_interval <= timedelta(milliseconds=200)
        assert policy.maximum_interval is not None and policy.maximum_interval <= timedelta(seconds=1)


@pytest.mark.parametrize(("ttl_s", "timeout_s"), [(60, 20), (10, 3.333), (6, 2), (5, 2), (2, 2), (1, 1)])
def test_the_heartbeat_timeout_is_a_third_of_the_lease_ttl_at_least_two_seconds(ttl_s: int, timeout_s: float) -> None:
    """Temporal gives up on a stopped worker's attempt within a third of the TTL, so that a retry a stopped worker's
    open poll absorbs times out too before the lease lapses; never below 2 s, never above the TTL."""
    ttl = timedelta(seconds=ttl_s)
    assert heartbeat_timeout_for(ttl) == timedelta(seconds=timeout_s)
    assert ttl_refusal(heartbeat_timeout_for(ttl), ttl) is None
    assert ttl_refusal(ttl, ttl) is None  # a call scheduled before, or by hand, with the TTL itself
    assert ttl_refusal(ttl * 2, ttl) is not None


def test_a_zero_heartbeat_timeout_read_from_temporal_is_none_and_the_lease_keeps_its_ttl() -> None:
    """Temporal's zero heartbeat timeout (``update-options --heartbeat-timeout 0``) means none: an attempt that
    read it as a timeout of 0 s claimed and renewed leases that had lapsed already."""
    ttl, scheduled = timedelta(seconds=10), timedelta(seconds=10 / 3)
    pending = PendingActivityInfo()
    assert heartbeat_timeout_of(pending) is None
    pending.activity_options.heartbeat_timeout.FromSeconds(0)
    assert heartbeat_timeout_of(pending) is None
    assert followed_timeout(heartbeat_timeout_of(pending), scheduled, ttl) == ttl
    pending.activity_options.heartbeat_timeout.FromSeconds(3)
    assert followed_timeout(heartbeat_timeout_of(pending), scheduled, ttl) == timedelta(seconds=3)


@pytest.mark.parametrize(("real_attempts", "delay_s"), [(1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (40, 30)])
def test_a_recorded_failure_is_paced_by_the_tasks_real_attempts(real_attempts: int, delay_s: int) -> None:
    assert failure_retry_delay(real_attempts) == timedelta(seconds=delay_s)


def test_an_outage_is_paced_by_temporals_attempts_up_to_ten_seconds() -> None:
    assert [ledger_retry_delay(n).total_seconds() for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 8, 10, 10]


def test_a_pause_a_reset_a_shutdown_and_an_outage_give_their_attempt_back() -> None:
    back = {e for e in ErrorClass if not e.counts_as_attempt}
    assert back == {
        ErrorClass.SHUTDOWN,
        ErrorClass.PAUSED,
        ErrorClass.RESET,
        ErrorClass.LEDGER_UNAVAILABLE,
        ErrorClass.HEARTBEAT_TIMEOUT_CHANGED,  # an operator's heartbeat timeout the attempt could not keep
    }
    assert [cause.error_class for cause in Interruption] == [
        ErrorClass.PAUSED,
        ErrorClass.RESET,
        ErrorClass.SHUTDOWN,
        ErrorClass.TIMED_OUT,
        ErrorClass.HEARTBEAT_TIMEOUT_CHANGED,
        ErrorClass.RETRYABLE,
    ]


def test_worker_recovery_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = AgentLeaseSettings()
    assert (defaults.sticky_schedule_to_start, defaults.activity_pollers, defaults.workflow_pollers) == (
        timedelta(seconds=3),
        1,
        2,
    )
    monkeypatch.setenv("AGENTLEASE_STICKY_SCHEDULE_TO_START", "1.5")
    monkeypatch.setenv("AGENTLEASE_ACTIVITY_POLLERS", "4")
    monkeypatch.setenv("AGENTLEASE_WORKFLOW_POLLERS", "3")
    settings = AgentLeaseSettings()
    assert (settings.sticky_schedule_to_start, settings.activity_pollers, settings.workflow_pollers) == (
        timedelta(seconds=1.5),
        4,
        3,
    )
    monkeypatch.setenv("AGENTLEASE_WORKFLOW_POLLERS", "1")  # a sticky and a normal poll at least
    with pytest.raises(ValueError, match="workflow_pollers"):
        AgentLeaseSettings()
