"""Tools used by the integration tests (also loaded by worker subprocesses through
``AGENTLEASE_TOOL_MODULES=tests.integration.tools``)."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import activity

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import (
    AmbiguousSideEffectError,
    CredentialToolError,
    LeaseLostError,
    PermanentToolError,
    RetryableToolError,
)
from agentlease.records import SettlementReceipt
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool

PROBES: dict[str, list[dict[str, Any]]] = {}
"""What each attempt saw, by task id (in-process workers only)."""

GATES: dict[str, asyncio.Event] = {}
"""Set by a test to let a held first attempt resume, by task id."""


class NoArgs(BaseModel):
    pass


class HoldArgs(BaseModel):
    hold_first_attempt: bool = True


def _receipt(ctx: LeaseContext, system: str) -> SettlementReceipt:
    return SettlementReceipt(
        external_system=system,
        external_id=f"{ctx.claim.task_id}@{ctx.fencing_token}",
        status="present",
        details={"generation": ctx.fencing_token, "owner": ctx.worker_identity},
        verified_at=datetime.now(UTC),
    )


def gate(task_id: str) -> asyncio.Event:
    return GATES.setdefault(task_id, asyncio.Event())


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=2), start_to_close=timedelta(minutes=2))
async def held_write(ctx: LeaseContext, args: HoldArgs) -> ToolResult:
    """First attempt: holds inside external_call until its gate opens, then tries to carry on."""
    probe: dict[str, Any] = {
        "generation": ctx.fencing_token,
        "owner": ctx.worker_identity,
        "idempotency_key": ctx.idempotency_key,
        "previous_stage": ctx.previous_stage,
        "activity_id": activity.info().activity_id,
    }
    PROBES.setdefault(ctx.claim.task_id, []).append(probe)
    await ctx.advance(Stage.PREFLIGHT, "checking the target")
    await ctx.advance(Stage.EXTERNAL_CALL, "writing the record")
    if ctx.claim.attempts == 1 and args.hold_first_attempt:
        # A paused worker notices nothing: a cancellation delivered through heartbeats is ignored.
        while True:
            try:
                await gate(ctx.claim.task_id).wait()
                break
            except asyncio.CancelledError:
                continue
        try:
            await ctx.renew("resumed after the pause")
        except LeaseLostError as exc:
            probe["renew_error"] = exc
        return ToolResult(receipt=_receipt(ctx, "held"), output={"written_by": ctx.worker_identity})
    await ctx.advance(Stage.COMMIT, "record written")
    await ctx.advance(Stage.VERIFY, "reading the record back")
    return ToolResult(receipt=_receipt(ctx, "held"), output={"written_by": ctx.worker_identity})


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=3), start_to_close=timedelta(minutes=2))
async def die_after_commit(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """First attempt: three stages within one heartbeat throttle window, then the process dies."""
    if ctx.claim.attempts == 1:
        await ctx.advance(Stage.PREFLIGHT, "checking")
        await ctx.advance(Stage.EXTERNAL_CALL, "calling")
        await ctx.advance(Stage.COMMIT, "committing")
        os._exit(17)
    details = activity.info().heartbeat_details
    await ctx.advance(Stage.VERIFY, f"previous attempt reached {ctx.previous_stage}; reading back")
    return ToolResult(
        receipt=_receipt(ctx, "dying"),
        output={
            "previous_stage": ctx.previous_stage,
            "temporal_heartbeat_details": details[0] if details else None,
        },
    )


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=5), start_to_close=timedelta(minutes=2))
async def wait_forever(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Enters preflight and then waits until the attempt is cancelled (worker shutdown)."""
    await ctx.advance(Stage.PREFLIGHT, "waiting for a slot that never comes")
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=5))
async def quick(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Settles at once."""
    await ctx.advance(Stage.PREFLIGHT, "nothing to check")
    await ctx.advance(Stage.VERIFY, "nothing to read back")
    return ToolResult(receipt=_receipt(ctx, "quick"))


QUIET_S = 3.0
"""How long ``quiet`` goes without renewing: past its heartbeat timeout (2 s), within its lease TTL (6 s)."""


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=6))
async def quiet(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """A slow downstream call: no renewal for longer than Temporal's heartbeat timeout, within the lease TTL."""
    await ctx.advance(Stage.PREFLIGHT, "asking a slow downstream")
    await asyncio.sleep(QUIET_S)
    await ctx.advance(Stage.VERIFY, "it answered")
    return ToolResult(receipt=_receipt(ctx, "quiet"))


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=3))
async def gated(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Renews its lease with a specific reason until its gate opens, then settles."""
    await ctx.advance(Stage.PREFLIGHT, "waiting for the gate")
    await _renew_until_gate(ctx, "gate still closed", every_s=0.5)
    await ctx.advance(Stage.VERIFY, "gate open")
    return ToolResult(receipt=_receipt(ctx, "gated"))


async def _renew_until_gate(ctx: LeaseContext, reason: str, *, every_s: float) -> None:
    """Renew the lease every ``every_s`` seconds until the task's gate opens."""
    opened = gate(ctx.claim.task_id)
    while not opened.is_set():
        try:
            await asyncio.wait_for(opened.wait(), timeout=every_s)
        except TimeoutError:
            await ctx.renew(reason)


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=5))
async def always_permanent(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Fails deterministically: dead-lettered on the first attempt."""
    await ctx.advance(Stage.PREFLIGHT, "validating")
    raise PermanentToolError("the target rejects this request")


CREDENTIALS_OK: dict[str, bool] = {}
"""Per task id: whether `needs_credential` finds its credential (set by a test to 'repair access')."""


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=5))
async def needs_credential(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Blocked until a test repairs its credential."""
    await ctx.advance(Stage.PREFLIGHT, "loading the credential")
    if not CREDENTIALS_OK.get(ctx.claim.task_id):
        raise CredentialToolError("token revoked")
    await ctx.advance(Stage.VERIFY, "credential valid")
    return ToolResult(receipt=_receipt(ctx, "credential"))


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=5))
async def send_once(ctx: LeaseContext, args: HoldArgs) -> ToolResult:
    """Unsafe (so it waits for approval); with ``hold_first_attempt`` its first attempt cannot tell
    whether the send happened."""
    PROBES.setdefault(ctx.claim.task_id, []).append(
        {"generation": ctx.fencing_token, "idempotency_key": ctx.idempotency_key, "recovery": ctx.recovery.action}
    )
    await ctx.advance(Stage.PREFLIGHT, "checking the recipient")
    await ctx.advance(Stage.EXTERNAL_CALL, "sending")
    if args.hold_first_attempt and ctx.claim.attempts == 1:
        raise AmbiguousSideEffectError("connection reset after DATA")
    await ctx.advance(Stage.VERIFY, "accepted by the server")
    return ToolResult(receipt=_receipt(ctx, "mail"))


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=2), max_attempts=2)
async def always_retryable(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Fails transiently every time: dead-lettered after two real attempts."""
    await ctx.advance(Stage.PREFLIGHT, "calling a flaky upstream")
    raise RetryableToolError("503 from upstream")


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=2))
async def long_call(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Sits in external_call, renewing its lease, until the lease is lost (a cancel ends it)."""
    await ctx.advance(Stage.PREFLIGHT, "preparing a long export")
    await ctx.advance(Stage.EXTERNAL_CALL, "export running")
    PROBES.setdefault(ctx.claim.task_id, []).append({"claim": ctx.claim})
    while True:
        await asyncio.sleep(0.2)
        await ctx.renew("export still running")


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=5))
async def commit_then_fail_early(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Attempt 1 reaches commit and fails; attempt 2 fails in preflight; attempt 3 settles."""
    PROBES.setdefault(ctx.claim.task_id, []).append(
        {"previous_stage": ctx.previous_stage, "recovery": ctx.recovery.action}
    )
    await ctx.advance(Stage.PREFLIGHT, "checking the target")
    if ctx.claim.attempts == 1:
        await ctx.advance(Stage.EXTERNAL_CALL, "writing")
        await ctx.advance(Stage.COMMIT, "written")
        raise RetryableToolError("connection dropped after the write")
    if ctx.claim.attempts == 2:
        raise RetryableToolError("upstream 503 before reading back")
    await ctx.advance(Stage.VERIFY, "reading back")
    return ToolResult(receipt=_receipt(ctx, "regress"))


@tool(
    side_effect=SideEffectClass.IDEMPOTENT,
    lease_ttl=timedelta(seconds=3),
    max_attempts=3,
    start_to_close=timedelta(minutes=2),
)
async def fail_twice_then_hold(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Real attempts 1 and 2 fail; from the third on it renews in preflight until its gate opens, then settles."""
    PROBES.setdefault(ctx.claim.task_id, []).append(
        {
            "generation": ctx.fencing_token,
            "attempts": ctx.claim.attempts,
            "temporal_attempt": activity.info().attempt,
            "heartbeat_timeout": activity.info().heartbeat_timeout,
        }
    )
    await ctx.advance(Stage.PREFLIGHT, "calling a flaky upstream")
    if ctx.claim.attempts <= 2:
        raise RetryableToolError("503 from upstream")
    await _renew_until_gate(ctx, "holding until the test's gate opens", every_s=0.3)
    await ctx.advance(Stage.VERIFY, "gate open")
    return ToolResult(receipt=_receipt(ctx, "flaky"))


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=3), requires_approval=False)
async def unsafe_long_call(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Unsafe: sits in external_call (its message may be on its way), renewing, until the lease is lost."""
    await ctx.advance(Stage.PREFLIGHT, "checking the recipient")
    await ctx.advance(Stage.EXTERNAL_CALL, "sending the message")
    while True:
        await asyncio.sleep(0.2)
        await ctx.renew("waiting for the mail server's answer")


class ChargeArgs(BaseModel):
    url: str


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=timedelta(seconds=3), max_attempts=2)
async def busy_downstream_charge(ctx: LeaseContext, args: ChargeArgs) -> ToolResult:
    """POSTs to ``url`` with the lease's headers and the documented ``response.raise_for_status()``."""
    import httpx

    await ctx.advance(Stage.EXTERNAL_CALL, f"charging at {args.url}")
    async with httpx.AsyncClient() as http:
        response = await http.post(args.url, json={}, headers=ctx.downstream_headers())
    response.raise_for_status()
    await ctx.advance(Stage.VERIFY, "charged")
    return ToolResult(receipt=_receipt(ctx, "busy"), output=response.json())
