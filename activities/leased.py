"""Leased activities: each tool call claims its task in the ledger before the tool runs.

One Temporal activity per tool (activity type = tool name), taking one typed input
(:class:`ToolCall`) and returning a :class:`ToolOutcome`. How an attempt ends maps onto Temporal:

========================================  ==========================================================
ledger says                               Temporal sees
========================================  ==========================================================
lease still held by an earlier attempt    retryable ``LeaseHeld`` with ``next_retry_delay`` = time left
already settled (G6)                      the stored outcome, tool not run
cancelled / dead-lettered                 non-retryable ``TaskCancelled`` / ``DeadLettered``
tool raised ``PermanentToolError``        dead-lettered; non-retryable ``DeadLettered``
too many real attempts                    dead-lettered; non-retryable ``DeadLettered``
tool raised anything else                 released with its error class; retryable
lease lost (renew or settle refused)      retryable ``LeaseLost``; a refused settle is ``late_unapplied``
worker shutdown (SIGTERM past grace)      released with error class ``shutdown``
========================================  ==========================================================
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.lease_context import LeaseContext
from activities.tool import ToolRegistry, ToolSpec
from agentlease.enums import FailureType, Stage, TaskStatus
from agentlease.errors import (
    LeaseHeldError,
    LeaseLostError,
    MissingHeartbeatTimeoutError,
    PermanentToolError,
    TaskClosedError,
    one_line,
)
from agentlease.ledger.store import Ledger
from agentlease.records import Claim, SettlementReceipt, TaskSpec, ToolCall, ToolInfo, ToolOutcome, TraceLink
from agentlease.settings import AgentLeaseSettings
from workflows.agent_run import DESCRIBE_TOOLS


MIN_RETRY_DELAY = timedelta(milliseconds=20)
"""Smallest ``next_retry_delay`` asked of Temporal while a lease is still held."""



class LeasedActivities:
    """Builds the worker's activities over one ledger and one tool registry.

    Args:
        ledger: the lease ledger.
        registry: the tools this worker serves.
        identity: the ``lease_owner`` of every claim this worker makes.
        settings: handed to tools through their :class:`LeaseContext`.
    """

    def __init__(self, ledger: Ledger, registry: ToolRegistry, identity: str, settings: AgentLeaseSettings) -> None:
        self._ledger = ledger
        self._registry = registry
        self._identity = identity
        self._settings = settings

    def activities(self) -> list[Any]:
        """The activity callables to register on a Temporal worker."""
        return [self._describe_tools_activity(), *(self._tool_activity(spec) for spec in self._registry.specs())]

    def _describe_tools_activity(self) -> Any:
        registry = self._registry

        @activity.defn(name=DESCRIBE_TOOLS)
        async def describe_tools() -> list[ToolInfo]:
            return registry.catalog()

        return describe_tools

    def _tool_activity(self, spec: ToolSpec) -> Any:
        async def run_tool(call: ToolCall) -> ToolOutcome:
            return await self.execute(spec, call)

        run_tool.__name__ = f"tool_{spec.name}"
        return activity.defn(name=spec.name)(run_tool)

    async def execute(self, spec: ToolSpec, call: ToolCall) -> ToolOutcome:
        """Run one attempt of a tool call under a ledger lease (see the module table)."""
        info = activity.info()
        if info.heartbeat_timeout is None or info.heartbeat_timeout <= timedelta(0):
            message = str(
                MissingHeartbeatTimeoutError(
                    f"tool call {call.task_id!r} was scheduled without a heartbeat_timeout; "
                    "its lease would have no TTL (G9)"
                )
            )
            raise ApplicationError(message, type=FailureType.MISSING_HEARTBEAT_TIMEOUT, non_retryable=True)
        task_spec = TaskSpec(
            task_id=call.task_id,
            agent_run_id=call.agent_run_id,
            step_id=call.step_id,
            tool=spec.name,
            side_effect_class=spec.side_effect_class,
            idempotency_key=call.idempotency_key,
            lease_ttl=info.heartbeat_timeout,
        )
        trace = TraceLink(
            workflow_id=info.workflow_id,
            run_id=info.workflow_run_id,
            activity_id=info.activity_id,
            attempt=info.attempt,
        )
        try:
            claim = await self._ledger.claim(task_spec, self._identity, trace=trace)
        except LeaseHeldError as exc:
            raise ApplicationError(
                str(exc), type=FailureType.LEASE_HELD, next_retry_delay=max(exc.retry_after, MIN_RETRY_DELAY)
            ) from None
        except TaskClosedError as exc:
            return await self._closed_outcome(exc)

        stored = await self._ledger.receipt(claim.idempotency_key)
        if stored is not None:
            # G6: an earlier attempt (or task with the same key) already proved the outcome.
            await self._ledger.settle(claim, stored.receipt)
            return self._settled(claim, stored.receipt, None)
        if claim.attempts > spec.max_attempts:
            await self._end(
                claim,
                dead_letter=True,
                error_class="max_attempts",
                error=f"{claim.attempts - 1} real attempts failed (limit {spec.max_attempts})",
            )
            raise ApplicationError(
                f"{call.task_id}: dead-lettered after {spec.max_attempts} attempts",
                type=FailureType.DEAD_LETTERED,
                non_retryable=True,
            )

        context = LeaseContext(
            ledger=self._ledger,
            claim=claim,
            side_effect_class=spec.side_effect_class,
            previous_receipt=stored,
            settings=self._settings,
        )
        try:
            args = spec.args_model.model_validate(call.arguments)
            result = await spec.fn(context, args)
        except LeaseLostError as exc:
            raise ApplicationError(str(exc), type=FailureType.LEASE_LOST) from None
        except (PermanentToolError, ValidationError) as exc:
            error = one_line(exc)
            await self._end(claim, dead_letter=True, error_class=type(exc).__name__, error=error)
            raise ApplicationError(f"{call.task_id}: {error}", type=FailureType.DEAD_LETTERED, non_retryable=True) from None
        except asyncio.CancelledError:
            reason = "shutdown" if activity.is_worker_shutdown() else "cancelled"
            await asyncio.shield(self._end(claim, dead_letter=False, error_class=reason, error=f"attempt {reason}"))
            raise
        except Exception as exc:
            await self._end(claim, dead_letter=False, error_class=type(exc).__name__, error=one_line(exc))
            raise ApplicationError(one_line(exc), type=type(exc).__name__) from None

        try:
            saved = await self._ledger.settle(claim, result.receipt, result=result.output)
        except LeaseLostError as exc:
            # G10: recorded as late_unapplied by the ledger; never reported as success.
            raise ApplicationError(str(exc), type=FailureType.LEASE_LOST) from None
        return self._settled(claim, saved.receipt, result.output)

    async def _end(self, claim: Claim, *, dead_letter: bool, error_class: str, error: str) -> None:
        end = self._ledger.dead_letter if dead_letter else self._ledger.release
        try:
            await end(claim, error_class=error_class, error=error)
        except LeaseLostError:
            pass  # Already recorded as lease_lost evidence; the newer holder decides.

    async def _closed_outcome(self, exc: TaskClosedError) -> ToolOutcome:
        record = await self._ledger.get_task(exc.task_id)
        if record.status is TaskStatus.SETTLED:
            return ToolOutcome(
                task_id=record.task_id,
                status=record.status,
                stage=record.stage,
                claim_generation=record.claim_generation,
                attempts=record.attempts,
                receipt=record.receipt,
            )
        error_type = FailureType.TASK_CANCELLED if record.status is TaskStatus.CANCELLED else FailureType.DEAD_LETTERED
        raise ApplicationError(str(exc), type=error_type, non_retryable=True)

    @staticmethod
    def _settled(claim: Claim, receipt: SettlementReceipt, output: dict[str, Any] | None) -> ToolOutcome:
        return ToolOutcome(
            task_id=claim.task_id,
            status=TaskStatus.SETTLED,
            stage=Stage.SETTLED,
            claim_generation=claim.generation,
            attempts=claim.attempts,
            receipt=receipt,
            result=output,
        )

