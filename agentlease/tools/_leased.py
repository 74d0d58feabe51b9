"""Leased activities: one per tool, each attempt claims its task in the ledger before the tool runs
(``docs/overview.md``, "How an attempt ends"); every outcome but a tool's own failure is raised ``BENIGN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from agentlease import limits
from agentlease.enums import ErrorClass, FailureType, Interruption, ProbeAnswer, RecoveryAction, Stage, TaskStatus
from agentlease.errors import (
    ApprovalRefusedError,
    BindingRefusedError,
    ClockBehindError,
    KeyInFlightError,
    LeaseHeldError,
    LeaseLostError,
    LedgerRefusedValueError,
    LedgerUnavailableError,
    TaskClosedError,
    downstream_refusal,
    one_line,
    raised_refusal,
)
from agentlease.lease import _entered as entered_lease
from agentlease.ledger.refusals import record_refusal
from agentlease.ledger.refused_writes import refused_writes
from agentlease.ledger.store import Ledger
from agentlease.observability.tracing import current_trace_id
from agentlease.records import (
    SETTLED_BY_EARLIER_RECEIPT,
    SETTLED_BY_PROBE,
    Claim,
    SettlementReceipt,
    StoredReceipt,
    TaskRecord,
    TaskSpec,
    ToolCall,
    ToolOutcome,
    TraceLink,
    approval_reason,
    approvals_required,
)
from agentlease.recovery._policy import RecoveryDecision, classify, decide, decide_after_probe
from agentlease.recovery.retries import MIN_RETRY_DELAY, failure_retry_delay, ledger_retry_delay
from agentlease.runtime.names import DESCRIBE_RUN, DESCRIBE_TOOLS
from agentlease.runtime.payloads import activity_input
from agentlease.runtime.shutdown import to_its_end
from agentlease.security.progress import PROGRESS_SECRET, mint_secret
from agentlease.security.redaction import redact
from agentlease.security.secrets import ToolSecrets, ToolSettings, secret_provider
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._binding import as_run, claimed_refusal, own_task, task_refusal, tool_refusal, ttl_refusal
from agentlease.tools._context import (
    LeaseContext,
    Liveness,
    attempt_heartbeat_timeout,
    heartbeat_timeout_of,
    pending_activity,
    report_refused_writes,
)
from agentlease.tools._declaration import ToolSpec
from agentlease.tools._deferred import DeferredWrites
from agentlease.tools._fenced_http import stamp_httpx
from agentlease.tools._probe import ProbeQuery, ProbeResult
from agentlease.tools._registry import ToolRegistry
from agentlease.tools._resources import ToolResources

EXPECTED = ApplicationErrorCategory.BENIGN
"""Category of the failures that report a recorded decision or a known condition, not a fault."""

SETTLE_RETRY = timedelta(milliseconds=250)
"""Pause between tries of a settle the ledger did not answer, while the lease may still be valid."""

PROBE_SHARE_OF_TTL = 0.8
"""A probe has this share of the lease TTL to answer (the attempt renewed just before it); slower: cannot tell."""

CLOCK_BEHIND_RETRY = timedelta(seconds=5)
"""``next_retry_delay`` of a claim refused because this process's clock runs behind a SQLite ledger."""

logger = logging.getLogger("agentlease.lease")


class LeasedActivities:
    """Builds the worker's activities over one ledger and one tool registry (the caller closes ``resources``)."""

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
        self._secrets = secret_provider(settings)
        self._settings_by_tool: dict[str, ToolSettings] = {}
        self._metrics = ledger.metrics
        self.deferred = DeferredWrites(self._metrics)
        """Writes an outage kept from the ledger, recorded once it is back."""
        self._refused_releases: set[tuple[str, int]] = set()  # (task id, generation) of attempts under way
        self._overran: set[asyncio.Future[ProbeResult]] = set()  # probes past their deadline, still running

    async def close(self) -> None:
        """Stop retrying deferred writes (what is left is logged, and left to the sweeper)."""
        await self.deferred.close()

    def activities(self) -> list[Any]:
        """The activity callables to register on a Temporal worker."""
        registry = self._registry

        @activity.defn(name=DESCRIBE_TOOLS)
        async def describe_tools() -> list[dict[str, Any]]:
            return [info.model_dump(mode="json") for info in registry.catalog()]

        @activity.defn(name=DESCRIBE_RUN)
        async def describe_run() -> dict[str, Any]:
            return {"tools": await describe_tools(), "progress_secret": mint_secret()}

        tools = [self._tool_activity(spec) for spec in registry.specs()]
        return [describe_tools, describe_run, _progress_secret, *tools]

    def _tool_settings(self, spec: ToolSpec) -> ToolSettings:
        """The settings ``spec``'s tool may read, made once per tool and worker."""
        found = self._settings_by_tool.get(spec.name)
        if found is None:
            found = self._settings_by_tool[spec.name] = ToolSettings(self._settings, spec.name, spec.settings)
        return found

    def _tool_activity(self, spec: ToolSpec) -> Any:
        async def run_tool(payload: dict[str, Any]) -> dict[str, Any]:
            # JSON in and out: the activity works under any payload converter, a malformed call refused in one line.
            call = activity_input(
                ToolCall, payload, f"malformed tool call for {spec.name}", FailureType.INVALID_TOOL_CALL
            )
            try:
                return (await self.execute(spec, call)).model_dump(mode="json")
            except LedgerUnavailableError as exc:
                raise _outage(call.task_id, exc) from None
            except LedgerRefusedValueError as exc:
                logger.warning("%s: %s; the step fails, it is not retried", call.task_id, exc)
                raise ApplicationError(str(exc), type=FailureType.LEDGER_REFUSED_VALUE, non_retryable=True) from None

        run_tool.__name__ = f"tool_{spec.name}"
        return activity.defn(name=spec.name)(run_tool)

    async def execute(self, spec: ToolSpec, call: ToolCall) -> ToolOutcome:
        """Run one attempt of a tool call under a ledger lease (``docs/overview.md``)."""
        with Liveness(spec.lease_ttl) as liveness:
            outcome = await self._execute(spec, call, liveness)
        if outcome.claim_generation > 1 and outcome.refused_writes is None:
            with contextlib.suppress(LedgerUnavailableError):  # the count only: the outcome stands
                outcome = outcome.model_copy(
                    update={"refused_writes": await refused_writes(self._ledger, outcome.task_id)}
                )
        return outcome

    async def _execute(self, spec: ToolSpec, call: ToolCall, liveness: Liveness) -> ToolOutcome:
        info = activity.info()
        if info.heartbeat_timeout is None or info.heartbeat_timeout <= timedelta(0):
            raise ApplicationError(
                f"tool call {call.task_id!r} was scheduled without a heartbeat_timeout; its lease would have no TTL"
                " (G9)",
                type=FailureType.MISSING_HEARTBEAT_TIMEOUT,
                non_retryable=True,
            )
        asked = approval_reason(spec.name, spec.requires_approval, call.arguments)
        approval_ttl = (spec.approval_ttl or self._settings.approval_ttl) if asked else None
        task_spec = as_run(
            TaskSpec.of(call, spec.side_effect_class, spec.lease_ttl, approval_ttl=approval_ttl), info.activity_type
        )
        trace = TraceLink(
            workflow_id=info.workflow_id,
            run_id=info.workflow_run_id,
            activity_id=info.activity_id,
            attempt=info.attempt,
            trace_id=current_trace_id(),  # the RunActivity span's trace, while tracing is on
        )
        refused = (
            tool_refusal(info.activity_type, call.tool)
            or task_refusal(info.workflow_id, task_spec, shared_key=call.share_idempotency_key)
            or ttl_refusal(info.heartbeat_timeout, spec.lease_ttl)
        )
        if refused is not None:
            await self._refuse_binding(task_spec, info.workflow_id, refused, trace)
        heartbeat_timeout = await attempt_heartbeat_timeout(info, spec.lease_ttl)
        try:
            claim = await self._claim(spec, task_spec, trace, heartbeat_timeout, liveness)
        except ApprovalRefusedError as exc:
            logger.warning("%s: %s; it waits to be approved", exc.task_id, exc.why)
            return await self._closed_outcome(exc)
        except TaskClosedError as exc:
            return await self._closed_outcome(exc)
        except ClockBehindError as exc:
            logger.warning("%s", exc)
            raise ApplicationError(
                str(exc), type=FailureType.CLOCK_BEHIND, next_retry_delay=CLOCK_BEHIND_RETRY, category=EXPECTED
            ) from None
        if heartbeat_timeout != claim.lease_ttl:
            logger.warning(
                "%s: Temporal's heartbeat timeout (%gs) differs from the lease TTL (%gs), recorded with claim "
                "generation %d; the ledger's TTL decides who holds the lease",
                claim.task_id,
                heartbeat_timeout.total_seconds(),
                claim.lease_ttl.total_seconds(),
                claim.generation,
            )

        approvers = approvals_required(spec.requires_approval)
        if why := await claimed_refusal(
            self._ledger, claim, spec.name, requires_approval=asked is not None, approvers=approvers
        ):
            await self._park(
                claim, RecoveryDecision(RecoveryAction.DEAD_LETTER, "refused by the ledger"), ErrorClass.PERMANENT, why
            )
        if claim.receipt_refused is not None:
            # A receipt stands for this key, made by another action: neither settle with it nor run.
            await self._park(
                claim,
                RecoveryDecision(RecoveryAction.DEAD_LETTER, "idempotency key reused for another action"),
                ErrorClass.PERMANENT,
                claim.receipt_refused,
            )
        stored, previous = claim.receipt, ErrorClass.parse(claim.previous_error_class)
        decision = decide(
            spec.side_effect_class,
            claim.previous_stage,
            receipt_present=stored is not None,
            error_class=previous,
            real_attempts=claim.attempts - 1,
            max_attempts=spec.max_attempts,
        )
        if decision.action is RecoveryAction.NEVER_RERUN and stored is not None:  # G6
            self._metrics.duplicate_delivery(spec.name, "settled")
            await to_its_end(self._ledger.settle(claim, stored.receipt))
            return self._settled(claim, stored.receipt, None, settled_by=SETTLED_BY_EARLIER_RECEIPT)
        if _probes_first(spec, claim.previous_stage, decision, previous):
            probed = await self._probe(
                spec,
                call,
                claim,
                decision,
                claim.previous_stage,
                real_attempts=claim.attempts - 1,
                since=claim.acquired_at,
            )
            if isinstance(probed, ToolOutcome):
                return probed
            decision = probed
        if not decision.action.runs_tool:
            await self._park(claim, decision, previous or ErrorClass.EXPIRED, "before this attempt ran")

        if spec.fenced:
            stamp_httpx()  # its requests to the downstreams it declared carry the lease's headers
        context = LeaseContext(
            ledger=self._ledger,
            claim=claim,
            side_effect_class=spec.side_effect_class,
            previous_receipt=stored,
            settings=self._tool_settings(spec),
            recovery=decision,
            resources=self._resources,
            secrets=ToolSecrets(self._secrets, spec.name),
            heartbeat_timeout=heartbeat_timeout,
            progress_key=call.progress_key,
            fenced=spec.fenced,
        )
        liveness.context = context
        try:
            return await self._run_tool(spec, call, claim, context)
        except BaseException as exc:
            lost = isinstance(exc, ApplicationError) and exc.type == FailureType.LEASE_LOST.value
            if lost or context.lease_lost or (claim.task_id, claim.generation) in self._refused_releases:
                await self._report_refused(claim, call.progress_key)
            raise
        finally:
            self._refused_releases.discard((claim.task_id, claim.generation))
            context.end_progress()

    async def _claim(
        self, spec: ToolSpec, task: TaskSpec, trace: TraceLink, heartbeat_timeout: timedelta, liveness: Liveness
    ) -> Claim:
        """Claim ``task``. A lease still held is waited for, heartbeating, when it lapses within what is left of
        :func:`held_lease_wait` (then claimed at once, in this same attempt); else ``LeaseHeld`` goes back to
        Temporal with the time left as its retry delay."""
        waits_until = time.monotonic() + held_lease_wait(spec.lease_ttl, activity.info(), liveness).total_seconds()
        while True:
            claiming = asyncio.ensure_future(
                self._ledger.claim(task, self._identity, trace=trace, heartbeat_timeout=heartbeat_timeout)
            )
            try:
                return await asyncio.shield(claiming)
            except asyncio.CancelledError:
                # The claim may be granted all the same (on SQLite it runs to its end on the ledger
                # thread): give it back rather than leave a lease nobody holds until its TTL lapses.
                with contextlib.suppress(Exception):
                    given_back = await claiming
                    await self._interrupted(given_back, "while claiming")
                    self._refused_releases.discard((given_back.task_id, given_back.generation))
                raise
            except LeaseHeldError as exc:
                self._metrics.duplicate_delivery(spec.name, "lease_held")
                wait = max(exc.retry_after, MIN_RETRY_DELAY)
                if time.monotonic() + wait.total_seconds() > waits_until:
                    raise ApplicationError(
                        str(exc), type=FailureType.LEASE_HELD, next_retry_delay=wait, category=EXPECTED
                    ) from None
                logger.info("%s; this attempt waits for it to lapse", exc)
                await asyncio.sleep(wait.total_seconds())

    async def _report_refused(self, claim: Claim, progress_key: str | None) -> None:
        """Tell the run of an attempt that lost its lease the task's count of refused writes (best effort)."""
        if progress_key is None:
            return
        try:
            count = await asyncio.shield(refused_writes(self._ledger, claim.task_id))
            await asyncio.shield(report_refused_writes(claim, progress_key, count))
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - never mask how the attempt ended
            logger.debug("refused writes of %s not reported to its run: %s", claim.task_id, exc)

    async def _run_tool(self, spec: ToolSpec, call: ToolCall, claim: Claim, context: LeaseContext) -> ToolOutcome:
        """Run the tool in its lease context, then settle or classify how it failed."""
        try:
            args = limits.check_finite_arguments(spec.args_model.model_validate(call.arguments), spec.name)
            result = await self._call_tool(spec, args, context)
            limits.check_tool_result(result.output, result.receipt.model_dump(mode="json"), spec.name)
        except LeaseLostError as exc:
            raise _lease_lost(exc) from None
        except LedgerUnavailableError as exc:  # at a renewal: the tool started no new side effect
            await self._release(claim, ErrorClass.LEDGER_UNAVAILABLE, one_line(exc))
            raise
        except asyncio.CancelledError:
            cause = await self._interrupted(claim, "while the tool ran")
            if cause not in (Interruption.SHUTDOWN, Interruption.CANCELLED):
                raise ApplicationError(
                    f"{claim.task_id}: attempt {cause.value} in Temporal; lease released ({cause.error_class.value})",
                    type=FailureType.INTERRUPTED,
                    category=EXPECTED,
                ) from None
            raise
        except Exception as exc:  # noqa: BLE001 - every way a tool fails is classified and recorded
            error_class = classify(raised_refusal(exc) or exc)
            error = limits.clip(redact(one_line(exc)))  # what the ledger, the run and history keep (docs/security.md)
            after = decide(
                spec.side_effect_class,
                context.stage or claim.previous_stage,
                receipt_present=False,
                error_class=error_class,
                real_attempts=claim.attempts,
                max_attempts=spec.max_attempts,
            )
            if after.action is RecoveryAction.RECONCILE and spec.probe is not None:
                # Did the action happen? Not happened: released, and the next attempt runs it with the same key.
                probed = await self._probe(
                    spec, call, claim, after, context.stage or claim.previous_stage, real_attempts=claim.attempts
                )
                if isinstance(probed, ToolOutcome):
                    return probed
                after = probed
            if not after.action.runs_tool:
                await self._park(claim, after, error_class, error)
            await self._release(claim, error_class, error)
            raise ApplicationError(
                error, type=error_class.value, next_retry_delay=failure_retry_delay(claim.attempts)
            ) from None

        try:  # shielded: a cancel now (superseded) must not abandon the settle, whose refusal is evidence (G10)
            saved = await to_its_end(self._settle(context, result.receipt, result.output))
        except LeaseLostError as exc:  # recorded as late_unapplied, never reported as success (G10)
            raise _lease_lost(exc, late=True) from None
        if context.committed_at is not None:
            self._metrics.settlement_latency(spec.name, time.perf_counter() - context.committed_at)
        return self._settled(claim, saved.receipt, redact(result.output))

    async def _call_tool(self, spec: ToolSpec, args: Any, context: LeaseContext) -> Any:
        """Run the tool; while the downstream holds its key in flight, wait under the lease and run it again."""
        waits = 0
        while True:
            try:
                with entered_lease(context):  # agentlease.lease answers inside the tool
                    return await spec.fn(context, args)
            except Exception as exc:
                busy = downstream_refusal(exc)
                if not isinstance(busy, KeyInFlightError):
                    raise
            waits += 1
            pause = min(max(busy.retry_after, MIN_RETRY_DELAY), context.claim.lease_ttl / 3)
            self._metrics.duplicate_delivery(spec.name, "key_in_flight")
            await context.renew(
                f"the downstream is still executing the call with key {context.idempotency_key} "
                f"(wait {waits}); asking again in {pause.total_seconds():g}s"
            )
            await asyncio.sleep(pause.total_seconds())
            context.stage = None  # the tool starts over; the ledger keeps the furthest stage it recorded

    async def _refuse_binding(self, task: TaskSpec, workflow_id: str | None, why: str, trace: TraceLink) -> NoReturn:
        """Refuse a call whose task, key or TTL is not its workflow's, recorded on its own task (dead-lettered)."""
        exc = BindingRefusedError(task.task_id, workflow_id, why)
        logger.warning("%s", exc)
        facts: dict[str, Any] = {"status": TaskStatus.DEAD_LETTERED.value}
        own = None if workflow_id is None else own_task(workflow_id, task)
        if own is not None:
            record = await record_refusal(
                self._ledger, own, str(exc), details={"named_task_id": task.task_id}, trace=trace
            )
            facts = _facts(record)
        raise _final(str(exc), facts, FailureType.DEAD_LETTERED)

    async def _settle(
        self, context: LeaseContext, receipt: SettlementReceipt, output: dict[str, Any] | None
    ) -> StoredReceipt:
        """Settle, retried while the ledger does not answer and the lease may be valid, then deferred."""
        claim = context.claim
        retried = False
        while True:
            try:
                return await self._ledger.settle(claim, receipt, result=output, retried=retried)
            except LedgerUnavailableError:
                retried = True
                if time.monotonic() + SETTLE_RETRY.total_seconds() >= context.confirmed_until:
                    self.deferred.add(
                        f"settle of {claim.task_id} (generation {claim.generation})",
                        lambda: self._ledger.settle(claim, receipt, result=output, retried=True),
                    )
                    raise
                await asyncio.sleep(SETTLE_RETRY.total_seconds())

    async def _interrupted(self, claim: Claim, when: str) -> Interruption:
        """Release the lease of an attempt Temporal cancelled, with the cause."""
        cause, facts = await _interruption()
        error = f"attempt cancelled {when} ({cause.value})"
        if cause is Interruption.HEARTBEAT_TIMEOUT_CHANGED:
            error = (
                f"Temporal timed the attempt out on a heartbeat timeout changed to "
                f"{facts['heartbeat_timeout_ms'] / 1000:g}s (lease TTL {claim.lease_ttl.total_seconds():g}s), "
                "shorter than this attempt's heartbeats could keep; the attempt is given back and the next one "
                "heartbeats to it"
            )
            self._metrics.heartbeat_timeout_changed(claim.tool, shorter=True)
        details = {"cause": cause.value, **facts, **({"lease_ttl_ms": round(claim.lease_ttl / _MS)} if facts else {})}
        await self._release(claim, cause.error_class, error, details=details)
        return cause

    async def _release(
        self, claim: Claim, error_class: ErrorClass, error: str, *, details: dict[str, Any] | None = None
    ) -> None:
        """Release the lease; refused: already recorded as ``lease_lost``; the ledger down: deferred."""
        release = functools.partial(self._ledger.release, claim, error_class=error_class, error=error, details=details)

        async def released() -> None:  # its outcome handled inside: a cancelled caller may not wait for it
            try:
                await release()
            except LeaseLostError:  # recorded as lease_lost; the newer holder decides (the run is told, see execute)
                self._refused_releases.add((claim.task_id, claim.generation))
            except LedgerUnavailableError:
                what = f"release of {claim.task_id} (generation {claim.generation}, {error_class.value})"
                self.deferred.add(what, lambda: release(retried=True))

        await to_its_end(released())  # a cancel must not abandon the release half-way (the trail would miss its end)

    async def _park(self, claim: Claim, decision: RecoveryDecision, error_class: ErrorClass, error: str) -> NoReturn:
        """Apply a decision that does not run the tool, then fail the attempt non-retryably (deferred in an outage)."""
        status = decision.action.parks_as
        if status is None:  # stay cancelled / never rerun: the ledger's record says how it ended
            record = await self._ledger.get_task(claim.task_id)
            raise _final(f"{claim.task_id}: {decision.rule}", _facts(record), FailureType.TASK_CLOSED) from None
        reason = limits.clip(f"{decision.rule} ({error})")
        park = functools.partial(
            self._ledger.await_decision, claim, status=status, error_class=error_class, error=reason
        )

        async def parked() -> None:  # deferred inside: a cancelled caller may not wait for it
            try:
                await park()
            except LedgerUnavailableError:
                what = f"{status.value} of {claim.task_id} (generation {claim.generation})"
                self.deferred.add(what, lambda: park(retried=True))
                raise

        try:
            await to_its_end(parked())
        except LeaseLostError as exc:
            raise _lease_lost(exc) from None
        record = await self._ledger.get_task(claim.task_id)
        assert status.failure_type is not None
        # No cause: the tool's own exception would carry its unredacted message.
        raise _final(f"{claim.task_id}: {reason}", _facts(record), status.failure_type) from None

    async def _closed_outcome(self, exc: TaskClosedError) -> ToolOutcome:
        record = await self._ledger.get_task(exc.task_id)
        if record.status is TaskStatus.SETTLED:
            self._metrics.duplicate_delivery(record.tool, "settled")
            return ToolOutcome.of(record).model_copy(update={"settled_by": SETTLED_BY_EARLIER_RECEIPT})
        raise _final(str(exc), _facts(record), record.status.failure_type or FailureType.TASK_CLOSED)

    @staticmethod
    def _settled(
        claim: Claim, receipt: SettlementReceipt, output: dict[str, Any] | None, *, settled_by: str | None = None
    ) -> ToolOutcome:
        return ToolOutcome(
            task_id=claim.task_id,
            status=TaskStatus.SETTLED,
            stage=Stage.SETTLED,
            claim_generation=claim.generation,
            attempts=claim.attempts,
            receipt=receipt,
            result=output,
            settled_by=settled_by,
            lease_owner=claim.owner,
            claimed_at=claim.acquired_at,
        )

    async def _probe(
        self,
        spec: ToolSpec,
        call: ToolCall,
        claim: Claim,
        decision: RecoveryDecision,
        stage: Stage | None,
        *,
        real_attempts: int,
        since: datetime | None = None,
    ) -> ToolOutcome | RecoveryDecision:
        """Ask the tool's probe whether the action happened: the settled outcome, or the decision to go on with.
        ``since``: when the write may last have been made, on the ledger's clock (``None``: now, as this attempt's
        own call just ended); a "not happened" inside the tool's settle window from then is asked again."""
        assert spec.probe is not None
        ambiguous = decision.action is RecoveryAction.RECONCILE
        await self._renew(
            claim,
            f"probe: asking the downstream whether the action {claim.idempotency_key} happened "
            f"(an earlier attempt reached {stage.value if stage else 'no stage'})",
        )
        result = await self._ask(spec, call, claim, stage, real_attempts)
        if result.answer is ProbeAnswer.NOT_HAPPENED and spec.settle_window is not None:
            since = since or await self._ledger.db_now()
            result = await self._ask_while_settling(spec, call, claim, stage, real_attempts, since, result)
        self._metrics.probe(spec.name, result.answer.value if "failed" not in result.evidence else "failed")
        evidence = {"probe": result.answer.value, **result.evidence}
        if result.answer is ProbeAnswer.HAPPENED:
            assert result.receipt is not None
            try:
                saved = await to_its_end(self._ledger.settle(claim, result.receipt, result=None, reconciled=evidence))
            except LeaseLostError as exc:
                raise _lease_lost(exc, late=True) from None
            if ambiguous:
                self._metrics.ambiguity_resolved(spec.name, "probe", "happened")
            logger.info("%s: reconciled by its probe, no person involved: %s", claim.task_id, result.summary())
            return self._settled(claim, saved.receipt, None, settled_by=SETTLED_BY_PROBE)
        if result.answer is ProbeAnswer.NOT_HAPPENED:
            previous = ErrorClass.parse(claim.previous_error_class)
            after = decide_after_probe(previous, real_attempts=real_attempts, max_attempts=spec.max_attempts)
            if ambiguous:
                self._metrics.ambiguity_resolved(spec.name, "probe", "not_happened")
            goes_on = after if ambiguous else decision
            note = f"probe: the action did not happen ({result.summary()}); {goes_on.rule}"
            await self._renew(claim, note, {"probe": evidence})
            return goes_on
        if result.answer is ProbeAnswer.CONFLICT:  # never run again: a person decides, with the probe's evidence
            why = f"the probe found the key with other arguments: {result.summary()}"
            await self._renew(claim, f"probe: {why}", {"probe": evidence})
            return RecoveryDecision(RecoveryAction.RECONCILE, f"never run again, a person decides ({why})")
        why = f"the probe could not tell: {result.summary()}"
        if not ambiguous:
            await self._renew(claim, f"probe: {why}; {decision.rule}", {"probe": evidence})
            return decision
        return RecoveryDecision(decision.action, f"{decision.rule} ({why})")

    async def _ask_while_settling(
        self,
        spec: ToolSpec,
        call: ToolCall,
        claim: Claim,
        stage: Stage | None,
        real_attempts: int,
        since: datetime,
        result: ProbeResult,
    ) -> ProbeResult:
        """Ask the probe again, under the lease, while its answer is "not happened" and the tool's settle window
        since ``since`` lasts: the last answer (a "not happened" once the window has passed)."""
        assert spec.settle_window is not None
        window, asked = spec.settle_window, 1
        pause = min(max(window / SETTLE_WINDOW_ASKS, MIN_RETRY_DELAY), claim.lease_ttl / 3)
        while result.answer is ProbeAnswer.NOT_HAPPENED:
            age = await self._ledger.db_now() - since
            if age >= window:
                break
            wait = min(pause, window - age)
            await self._renew(
                claim,
                f"probe: not found yet, {age / _MS:.0f} ms into the settle window of {window / _MS:.0f} ms "
                f"(the downstream may not show the write yet); asking again in {wait / _MS:.0f} ms (answer {asked})",
            )
            await asyncio.sleep(wait.total_seconds())
            result = await self._ask(spec, call, claim, stage, real_attempts)
            asked += 1
        return result

    async def _renew(self, claim: Claim, reason: str, details: dict[str, Any] | None = None) -> None:
        try:
            await self._ledger.renew(claim, reason=reason, details=details)
        except LeaseLostError as exc:
            raise _lease_lost(exc) from None

    async def _ask(
        self, spec: ToolSpec, call: ToolCall, claim: Claim, stage: Stage | None, real_attempts: int
    ) -> ProbeResult:
        """The probe's answer; ``cannot_tell`` when its arguments do not validate, it raises or it is too slow."""
        assert spec.probe is not None
        limit_s = claim.lease_ttl.total_seconds() * PROBE_SHARE_OF_TTL
        try:
            args = spec.args_model.model_validate(call.arguments)
            query = ProbeQuery(
                tool=spec.name,
                task_id=claim.task_id,
                idempotency_key=claim.idempotency_key,
                arguments=args,
                previous_stage=stage,
                previous_error_class=claim.previous_error_class,
                real_attempts=real_attempts,
                fencing_token=claim.generation,
                earlier=await self._ledger.events(claim.task_id),
                settings=self._tool_settings(spec),
            )
            result = await self._within(spec.probe(query), limit_s)
        except LedgerUnavailableError:
            raise
        except TimeoutError:
            return ProbeResult.cannot_tell(f"the probe did not answer within {limit_s:g}s", failed=True)
        except Exception as exc:  # noqa: BLE001 - a probe that fails cannot tell; a person decides
            return ProbeResult.cannot_tell(f"the probe failed: {redact(one_line(exc))}", failed=True)
        if not isinstance(result, ProbeResult):
            return ProbeResult.cannot_tell(
                f"the probe returned {type(result).__name__}, not a ProbeResult", failed=True
            )
        receipt = None if result.receipt is None else result.receipt.model_dump(mode="json")
        try:
            limits.check_probe_answer(result.evidence, receipt)
        except ValueError as exc:  # refused, not cut: a person decides, as when the probe fails
            return ProbeResult.cannot_tell(f"{result.answer.value}, but {exc}", failed=True)
        named = None if result.receipt is None else result.receipt.details.get("idempotency_key")
        if named is not None and named != claim.idempotency_key:  # another action's readback: not this call's
            return ProbeResult.cannot_tell(
                f"happened, but its receipt names the idempotency key {str(named)[:80]!r}, "
                f"not this call's {claim.idempotency_key!r}",
                failed=True,
            )
        return result

    async def _within(self, probing: Awaitable[ProbeResult], limit_s: float) -> ProbeResult:
        """The probe's answer within ``limit_s``, else ``TimeoutError``; a probe that does not end when cancelled
        is left behind (kept in ``self._overran`` until it ends), never waited for past its share of the lease."""
        task = asyncio.ensure_future(probing)
        try:
            await asyncio.wait({task}, timeout=limit_s)
        finally:  # past its deadline, or the attempt itself cancelled
            if not task.done():
                task.cancel()
                self._overran.add(task)
                task.add_done_callback(_forget_probe(self._overran))
        if not task.done():
            raise TimeoutError
        return task.result()


def _forget_probe(overran: set[asyncio.Future[ProbeResult]]) -> Callable[[asyncio.Future[ProbeResult]], None]:
    """Done callback of a probe left behind: forget it, and read its outcome so that none is reported as lost."""

    def forget(task: asyncio.Future[ProbeResult]) -> None:
        overran.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            logger.info("a probe left behind at its deadline ended with %s", redact(one_line(error)))

    return forget


def held_lease_wait(lease_ttl: timedelta, info: activity.Info, liveness: Liveness) -> timedelta:
    """How long an attempt may wait, in all, for a lease held by another attempt to lapse: one lease TTL, at most
    half its start-to-close timeout, and none unless it heartbeats on its own (:class:`Liveness`). A lease that
    lapses later was renewed meanwhile: its holder is working, and Temporal's retry paces the next try."""
    if not liveness.active:
        return timedelta(0)
    if info.start_to_close_timeout is None:
        return lease_ttl
    return min(lease_ttl, info.start_to_close_timeout / 2)


@activity.defn(name=PROGRESS_SECRET)
async def _progress_secret() -> str:
    """A run's progress secret (:mod:`agentlease.security.progress`), minted outside the workflow's randomness."""
    return mint_secret()


async def _interruption() -> tuple[Interruption, dict[str, Any]]:
    """Why Temporal cancelled the running attempt, and the facts its release records."""
    details = activity.cancellation_details()
    if activity.is_worker_shutdown() or (details is not None and details.worker_shutdown):
        return Interruption.SHUTDOWN, {}
    if details is None:
        return Interruption.CANCELLED, {}
    if details.reset:
        return Interruption.RESET, {}
    if details.paused:
        return Interruption.PAUSED, {}
    if details.timed_out or details.not_found:
        return await _unknown_attempt(timed_out=details.timed_out)
    return Interruption.CANCELLED, {}


async def _unknown_attempt(*, timed_out: bool = False) -> tuple[Interruption, dict[str, Any]]:
    """Tell a reset, a timeout and a closed run apart by the run's pending activity."""
    info = activity.info()
    pending = await pending_activity(info)
    if pending is None:
        return (Interruption.TIMED_OUT if timed_out else Interruption.CANCELLED), {}
    # A timeout moves the attempt count on; a reset starts it again at 1.
    if pending.attempt <= info.attempt and not timed_out:
        return Interruption.RESET, {}
    changed = heartbeat_timeout_of(pending)
    scheduled = info.heartbeat_timeout
    if changed is not None and scheduled is not None and changed < scheduled:
        facts = {"heartbeat_timeout_ms": round(changed / _MS), "scheduled_heartbeat_timeout_ms": round(scheduled / _MS)}
        return Interruption.HEARTBEAT_TIMEOUT_CHANGED, facts
    return Interruption.TIMED_OUT, {}


_MS = timedelta(milliseconds=1)


SETTLE_WINDOW_ASKS = 4
"""How often a probe that finds nothing is asked within its tool's settle window: every quarter of the window,
but no sooner than 20 ms and no later than a third of the lease TTL (each time after a renewal)."""

_PROBED_ACTIONS = frozenset(
    {
        RecoveryAction.RECONCILE,
        RecoveryAction.RETRY_SAME_KEY,
        RecoveryAction.READ_BACK_FIRST,
        RecoveryAction.RETRY_READBACK,
    }
)
"""Decisions after an attempt that may have acted, before which a tool's probe is asked."""


def _probes_first(spec: ToolSpec, stage: Stage | None, decision: RecoveryDecision, previous: ErrorClass | None) -> bool:
    """Whether this attempt asks the tool's probe first (``docs/action-keys-and-probes.md``)."""
    return (
        spec.probe is not None
        and stage is not None
        and stage.crossed_external_call
        and decision.action in _PROBED_ACTIONS
        and previous is not ErrorClass.OPERATOR_RETRY
    )


def _lease_lost(exc: LeaseLostError, *, late: bool = False) -> ApplicationError:
    """The retryable ``LeaseLost`` failure, logged in one line: the guards held, not a fault."""
    kept = "its result recorded as late_unapplied" if late else "the newer holder decides"
    logger.info("%s; %s", exc, kept)
    return ApplicationError(str(exc), type=FailureType.LEASE_LOST, category=EXPECTED)


def _outage(task_id: str, exc: LedgerUnavailableError) -> ApplicationError:
    """The retryable ``LedgerUnavailable`` failure, logged in one line."""
    logger.warning("ledger unavailable, attempt of %s ends and is retried: %s", task_id, exc)
    attempt = activity.info().attempt if activity.in_activity() else 1
    return ApplicationError(
        str(exc), type=FailureType.LEDGER_UNAVAILABLE, next_retry_delay=ledger_retry_delay(attempt), category=EXPECTED
    )


def _final(message: str, facts: dict[str, Any], failure: FailureType) -> ApplicationError:
    """The non-retryable failure that reports a recorded decision, with the task's facts."""
    return ApplicationError(message, facts, type=failure.value, non_retryable=True, category=EXPECTED)


def _facts(record: TaskRecord) -> dict[str, Any]:
    """What the workflow shows of a task that did not settle: failure details of the activity."""
    return {
        "status": record.status.value,
        "stage": None if record.stage is None else record.stage.value,
        "claim_generation": record.claim_generation,
        "attempts": record.attempts,
    }
