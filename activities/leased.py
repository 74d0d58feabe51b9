"""Leased activities: each tool call claims its task in the ledger before the tool runs.

One Temporal activity per tool (activity type = tool name), taking one typed input
(:class:`ToolCall`) and returning a :class:`ToolOutcome`. At the start of every attempt the
recovery policy (:mod:`reconciliation.policy`) decides from the ledger's record of the previous
attempt; after a failure it decides again. How that maps onto Temporal:

==========================================  ========================================================
ledger / policy says                        Temporal sees
==========================================  ========================================================
lease still held by an earlier attempt      retryable ``LeaseHeld``, ``next_retry_delay`` = time left
receipt exists / already settled (G6)       the stored outcome; the tool does not run
retry, same key, read back first, readback  the tool runs, with ``ctx.recovery`` saying which
dead-letter (permanent, too many attempts)  non-retryable ``DeadLettered``
block (credential)                          non-retryable ``Blocked``
reconcile (unsafe past external_call, G7)   non-retryable ``NeedsReconciliation``
cancelled                                   non-retryable ``TaskCancelled``
tool raised a retryable error               released with its error class; retryable
lease lost (renew or settle refused)        retryable ``LeaseLost``; a refused settle is ``late_unapplied``
worker shutdown (SIGTERM past grace)        released with error class ``shutdown``
==========================================  ========================================================

``LeaseHeld`` and the parked outcomes (``DeadLettered``, ``Blocked``, ``NeedsReconciliation``,
``TaskCancelled``) are decisions already recorded in the ledger, not faults of the worker: they are
raised in Temporal's ``BENIGN`` error category, which the SDK logs at DEBUG instead of a WARNING
with a traceback and leaves out of its failure metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta
from typing import Any, NoReturn

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.lease_context import LeaseContext
from activities.registry import ToolRegistry
from activities.resources import ToolResources
from activities.tool import ToolSpec
from agentlease.enums import ErrorClass, FailureType, RecoveryAction, Stage, TaskStatus
from agentlease.errors import (
    LeaseHeldError,
    LeaseLostError,
    MissingHeartbeatTimeoutError,
    TaskClosedError,
    describe_validation_error,
    one_line,
)
from agentlease.ledger.store import Ledger
from agentlease.names import DESCRIBE_TOOLS
from agentlease.records import (
    Claim,
    SettlementReceipt,
    TaskRecord,
    TaskSpec,
    ToolCall,
    ToolOutcome,
    TraceLink,
)
from agentlease.settings import AgentLeaseSettings
from reconciliation.policy import RecoveryDecision, classify, decide

EXPECTED = ApplicationErrorCategory.BENIGN
"""Category of the failures that report a recorded decision rather than a fault (see the table)."""

MIN_RETRY_DELAY = timedelta(milliseconds=20)
"""Smallest ``next_retry_delay`` asked of Temporal while a lease is still held."""


class LeasedActivities:
    """Builds the worker's activities over one ledger and one tool registry.

    Args:
        ledger: the lease ledger.
        registry: the tools this worker serves.
        identity: the ``lease_owner`` of every claim this worker makes.
        settings: handed to tools through their :class:`LeaseContext`.
        resources: what the tools share (database engines); default a new, empty one. The caller
            closes it when the worker stops.
    """

    def __init__(
        self,
        ledger: Ledger,
        registry: ToolRegistry,
        identity: str,
        settings: AgentLeaseSettings,
        resources: ToolResources | None = None,
    ) -> None:
        self._ledger = ledger
        self._registry = registry
        self._identity = identity
        self._settings = settings
        self._resources = resources or ToolResources()
        self._metrics = ledger.metrics

    def activities(self) -> list[Any]:
        """The activity callables to register on a Temporal worker."""
        return [self._describe_tools_activity(), *(self._tool_activity(spec) for spec in self._registry.specs())]

    def _describe_tools_activity(self) -> Any:
        registry = self._registry

        @activity.defn(name=DESCRIBE_TOOLS)
        async def describe_tools() -> list[dict[str, Any]]:
            return [info.model_dump(mode="json") for info in registry.catalog()]

        return describe_tools

    def _tool_activity(self, spec: ToolSpec) -> Any:
        async def run_tool(payload: dict[str, Any]) -> dict[str, Any]:
            # JSON in and out, validated here: the activity works under any payload converter (the
            # frameworks' own included) and refuses a malformed call in one line.
            try:
                call = ToolCall.model_validate(payload)
            except ValidationError as exc:
                raise ApplicationError(
                    f"malformed tool call for {spec.name}: {describe_validation_error(exc)}",
                    type=FailureType.INVALID_TOOL_CALL.value,
                    non_retryable=True,
                ) from None
            return (await self.execute(spec, call)).model_dump(mode="json")

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
        task_spec = TaskSpec.of(call, spec.side_effect_class, info.heartbeat_timeout)
        trace = TraceLink(
            workflow_id=info.workflow_id,
            run_id=info.workflow_run_id,
            activity_id=info.activity_id,
            attempt=info.attempt,
        )
        claiming = asyncio.ensure_future(self._ledger.claim(task_spec, self._identity, trace=trace))
        try:
            claim = await asyncio.shield(claiming)
        except asyncio.CancelledError:
            # The claim may be granted all the same (on SQLite it runs to its end on the ledger
            # thread): give it back rather than leave a lease nobody holds until its TTL lapses.
            with contextlib.suppress(Exception):
                await self._cancelled(await claiming, "while claiming")
            raise
        except LeaseHeldError as exc:
            self._metrics.duplicate_delivery(spec.name, "lease_held")
            raise ApplicationError(
                str(exc),
                type=FailureType.LEASE_HELD,
                next_retry_delay=max(exc.retry_after, MIN_RETRY_DELAY),
                category=EXPECTED,
            ) from None
        except TaskClosedError as exc:
            return await self._closed_outcome(exc)

        stored = claim.receipt
        decision = decide(
            spec.side_effect_class,
            claim.previous_stage,
            receipt_present=stored is not None,
            error_class=ErrorClass.parse(claim.previous_error_class),
            real_attempts=claim.attempts - 1,
            max_attempts=spec.max_attempts,
        )
        if decision.action is RecoveryAction.NEVER_RERUN and stored is not None:
            # G6: an earlier attempt (or a task with the same key) already proved the outcome.
            self._metrics.duplicate_delivery(spec.name, "settled")
            await asyncio.shield(self._ledger.settle(claim, stored.receipt))
            return self._settled(claim, stored.receipt, None)
        if not decision.action.runs_tool:
            previous = ErrorClass.parse(claim.previous_error_class) or ErrorClass.EXPIRED
            await self._park(claim, decision, previous, "before this attempt ran")

        context = LeaseContext(
            ledger=self._ledger,
            claim=claim,
            side_effect_class=spec.side_effect_class,
            previous_receipt=stored,
            settings=self._settings,
            recovery=decision,
            resources=self._resources,
        )
        try:
            args = spec.args_model.model_validate(call.arguments)
            result = await spec.fn(context, args)
        except LeaseLostError as exc:
            raise ApplicationError(str(exc), type=FailureType.LEASE_LOST) from None
        except asyncio.CancelledError:
            await self._cancelled(claim, "while the tool ran")
            raise
        except Exception as exc:  # noqa: BLE001 - every way a tool fails is classified and recorded
            error_class = classify(exc)
            after = decide(
                spec.side_effect_class,
                context.stage or claim.previous_stage,
                receipt_present=False,
                error_class=error_class,
                real_attempts=claim.attempts,
                max_attempts=spec.max_attempts,
            )
            if not after.action.runs_tool:
                await self._park(claim, after, error_class, one_line(exc))
            await self._release(claim, error_class, one_line(exc))
            raise ApplicationError(one_line(exc), type=error_class.value) from None

        try:
            # Shielded: a cancellation delivered now (this attempt was superseded) must not abandon the
            # settle, whose refusal is the late_unapplied evidence (G10).
            saved = await asyncio.shield(self._ledger.settle(claim, result.receipt, result=result.output))
        except LeaseLostError as exc:
            # G10: recorded as late_unapplied by the ledger; never reported as success.
            raise ApplicationError(str(exc), type=FailureType.LEASE_LOST) from None
        if context.committed_at is not None:
            self._metrics.settlement_latency(spec.name, time.perf_counter() - context.committed_at)
        return self._settled(claim, saved.receipt, result.output)

    async def _cancelled(self, claim: Claim, when: str) -> None:
        """Release the lease of a cancelled attempt (worker shutdown: the attempt is given back)."""
        error_class = ErrorClass.SHUTDOWN if activity.is_worker_shutdown() else ErrorClass.RETRYABLE
        await asyncio.shield(self._release(claim, error_class, f"attempt cancelled {when} ({error_class.value})"))

    async def _release(self, claim: Claim, error_class: ErrorClass, error: str) -> None:
        try:
            await self._ledger.release(claim, error_class=error_class, error=error)
        except LeaseLostError:
            pass  # Already recorded as lease_lost evidence; the newer holder decides.

    async def _park(self, claim: Claim, decision: RecoveryDecision, error_class: ErrorClass, error: str) -> NoReturn:
        """Apply a decision that does not run the tool, then fail the attempt non-retryably."""
        status = decision.action.parks_as
        if status is None:  # stay cancelled / never rerun: the ledger's record says how it ended
            raise ApplicationError(
                f"{claim.task_id}: {decision.rule}",
                _facts(await self._ledger.get_task(claim.task_id)),
                type=FailureType.TASK_CLOSED.value,
                non_retryable=True,
                category=EXPECTED,
            )
        reason = f"{decision.rule} ({error})"
        try:
            await self._ledger.await_decision(claim, status=status, error_class=error_class, error=reason)
        except LeaseLostError as exc:
            raise ApplicationError(str(exc), type=FailureType.LEASE_LOST) from None
        record = await self._ledger.get_task(claim.task_id)
        failure = status.failure_type
        assert failure is not None
        raise ApplicationError(
            f"{claim.task_id}: {reason}", _facts(record), type=failure.value, non_retryable=True, category=EXPECTED
        )

    async def _closed_outcome(self, exc: TaskClosedError) -> ToolOutcome:
        record = await self._ledger.get_task(exc.task_id)
        if record.status is TaskStatus.SETTLED:
            self._metrics.duplicate_delivery(record.tool, "settled")
            return ToolOutcome.of(record)
        failure = record.status.failure_type or FailureType.TASK_CLOSED
        raise ApplicationError(str(exc), _facts(record), type=failure.value, non_retryable=True, category=EXPECTED)

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


def _facts(record: TaskRecord) -> dict[str, Any]:
    """What the workflow shows of a task that did not settle: failure details of the activity."""
    return {
        "status": record.status.value,
        "stage": None if record.stage is None else record.stage.value,
        "claim_generation": record.claim_generation,
        "attempts": record.attempts,
    }
