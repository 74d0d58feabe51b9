"""The decisions of a run with leased calls: the decision updates and the ``decide`` signal, their refusals,
and cancelling and stopping calls (deterministic workflow code; ``docs/decisions.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from agentlease.decisions.table import (
        DECISIONS,
        RUN_DECIDER,
        CancelRequest,
        DecisionRequest,
        LedgerDecision,
        LedgerRefusal,
        ReconcileRequest,
    )
    from agentlease.enums import DecisionKind, FailureType, RunState, TaskStatus
    from agentlease.records import PlanStep, RefusedDecision, TaskSpec, TaskView, ToolOutcome, arguments_fingerprint
    from agentlease.runtime.names import APPLY_DECISION, RECORD_REFUSAL
    from agentlease.security.codec import undecodable
    from agentlease.security.decision_auth import signed_decision
    from agentlease.security.redaction import redact
    from agentlease.workflow._handlers import parse_payload
    from agentlease.workflow._status import KEPT_REFUSALS, RunView

DECISION_UPDATES = ("approve", "reject", "redrive", "reconcile", "cancel")
"""The decision updates a run with leased calls takes."""

_DECISION_TIMEOUT = timedelta(seconds=30)
_DECISION_RETRY = RetryPolicy(
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,
    non_retryable_error_types=[FailureType.DECISION_REFUSED.value],
)
"""A decision is written to the ledger however long an outage lasts (attempts every 10 s at most)."""
_NOTHING_TO_CANCEL = (
    "run {run} has no open call to cancel: a whole-run cancel is applied, and its signature checked, on the "
    "calls it cancels; to stop the run, close it (keep_open) or cancel its workflow in Temporal"
)
_MAX_RECORDED_REFUSALS = 100
"""How many refusal summaries one run writes to the trail at most (the count goes on in ``status``)."""
_REFUSAL_FLUSH = timedelta(minutes=1)
_MAX_DECISION_CHARS = 250

Handler = Callable[[dict[str, Any]], Any]
"""An update's handler or validator: takes the update's JSON payload."""


class RunDecisions:
    """The run's decisions, each written to the ledger's evidence trail with who made it and why."""

    def __init__(
        self,
        run: RunView,
        steps: Mapping[str, PlanStep],
        running: Mapping[str, workflow.ActivityHandle[Any]],
        in_flight: Collection[str],
        task_of: Callable[[PlanStep], TaskSpec | None],
    ) -> None:
        self.cancelled = False
        """An operator cancelled the whole run, or its workflow was cancelled: no further call runs."""
        self._run = run
        self._steps = steps
        self._running = running
        self._in_flight = in_flight
        self._task_of = task_of
        self._cancelling: set[str] = set()  # steps cancelled in the ledger because the run was cancelled
        self._unrecorded: list[RefusedDecision] = []  # refused signals not yet in a trail summary
        self._unrecorded_since: Any = None
        self._unrecorded_total = 0
        self._recorded_summaries = 0
        self._last_flush: Any = None
        self.updates: dict[str, tuple[Handler, Handler]] = {
            command: (self._decision_handler(command), self._decision_validator(command))
            for command in ("approve", "reject", "redrive")
        }
        """Each decision update's handler and validator, in the order of :data:`DECISION_UPDATES`."""
        self.updates["reconcile"] = (self._reconcile, self._validate_reconcile)
        self.updates["cancel"] = (self._cancel, self._validate_cancel)
        assert tuple(self.updates) == DECISION_UPDATES

    async def apply(self, step: PlanStep, kind: DecisionKind, by: str, reason: str, **extra: Any) -> TaskView:
        """Write a decision to the ledger (evidence: who and why), then show its result."""
        task = self._task_of(step)
        assert task is not None, "a decision on a step whose tool the run does not know"
        view = self._run.tasks[step.step_id]
        self._run.show()
        if self._unrecorded:
            await self._flush_refusals()  # refused signals go to the trail with the run's next decision
        decision = LedgerDecision(kind=kind, task=task, by=by, reason=reason, **extra)
        unset = {name for name in ("rule", "request") if getattr(decision, name) is None}
        # without a rule or a request, the input a worker that knows neither reads (a rolling upgrade); a rule
        # and a request without the fields a single approver leaves at their defaults, for a worker before them
        payload = decision.model_dump(mode="json", exclude=unset)
        for name in ("rule", "request"):
            if (value := getattr(decision, name)) is not None:
                payload[name] = value.model_dump(mode="json", exclude_defaults=True)
        decided = await workflow.execute_activity(
            APPLY_DECISION,
            payload,
            start_to_close_timeout=_DECISION_TIMEOUT,
            retry_policy=_DECISION_RETRY,
            result_type=dict,
            summary=f"{step.step_id}: {kind.value} by {by}",
        )
        outcome = ToolOutcome.model_validate(decided)
        shown = TaskStatus.PENDING if outcome.status is TaskStatus.RELEASED else outcome.status
        if by != RUN_DECIDER or kind is not DecisionKind.AWAIT_APPROVAL:
            self._run.decided(_decision_text(step.step_id, kind))
        return self._run.update(
            step.step_id,
            status=shown,
            stage=outcome.stage,
            claim_generation=outcome.claim_generation or view.claim_generation,
            attempts=outcome.attempts if outcome.attempts else view.attempts,
            receipt=outcome.receipt,
            error=_ended_by(outcome.status, by, redact(reason)),
            approval_request=outcome.approval_request or view.approval_request,
        )

    def _answer(self) -> dict[str, Any]:
        """A decision update's answer: the run as it is now (shown first)."""
        self._run.refresh_waiting()
        self._run.show()
        return self._run.status_query()

    def _require(self, step_id: str, kind: DecisionKind) -> None:
        """Refuse a decision the step's status does not allow (decision table)."""
        rule = DECISIONS[kind]
        if step_id not in self._run.tasks:
            raise ValueError(f"run {self._run.run_id} has no step {step_id!r}")
        status = self._run.tasks[step_id].status
        if not rule.allows(status):
            allowed = " or ".join(sorted(s.value for s in rule.applies_to))
            raise ValueError(f"cannot {rule.command} step {step_id!r}: it is {status.value}, not {allowed}")

    def _decision_handler(self, command: str) -> Handler:
        kind = DecisionKind(command)

        async def handler(payload: dict[str, Any]) -> dict[str, Any]:
            request = parse_payload(DecisionRequest, payload, command)
            signed = signed_decision(command, request)
            await self.apply(self._steps[request.step_id], kind, request.by, request.reason, **signed)
            return self._answer()

        return handler

    def _decision_validator(self, command: str) -> Handler:
        kind = DecisionKind(command)

        def validator(payload: dict[str, Any]) -> None:
            request = parse_payload(DecisionRequest, payload, command)
            self._require(request.step_id, kind)
            asked = self._run.tasks[request.step_id].approval_request
            if kind is DecisionKind.APPROVE and asked is not None and request.by in asked.approved_by:
                raise ValueError(
                    f"cannot approve step {request.step_id!r}: {request.by} approved it already "
                    f"({asked.progress()}); each approval must come from another person"
                )
            seen = request.arguments_sha256
            if seen is not None and seen != arguments_fingerprint(self._steps[request.step_id].arguments):
                raise ValueError(
                    f"cannot {command} step {request.step_id!r}: its arguments are not the ones you saw "
                    f"(sha256 {seen[:12]}...); look again and decide on what it will run"
                )

        return validator

    async def _reconcile(self, payload: dict[str, Any]) -> dict[str, Any]:
        request = parse_payload(ReconcileRequest, payload, "reconcile")
        kind = self._reconcile_kind(request)
        extra: dict[str, Any] = signed_decision("reconcile", request)
        if DECISIONS[kind].settles:
            extra |= {"external_id": request.external_id, "observed": request.observed}
        await self.apply(self._steps[request.step_id], kind, request.by, request.reason, **extra)
        return self._answer()

    def _validate_reconcile(self, payload: dict[str, Any]) -> None:
        self._reconcile_kind(parse_payload(ReconcileRequest, payload, "reconcile"))

    def _reconcile_kind(self, request: ReconcileRequest) -> DecisionKind:
        """The decision a reconcile makes on its step's status, or a ``ValueError`` if none applies."""
        if request.step_id not in self._run.tasks:
            raise ValueError(f"run {self._run.run_id} has no step {request.step_id!r}")
        status = self._run.tasks[request.step_id].status
        kind = request.kind_for(status)
        if kind is None:
            allowed = " or ".join(
                dict.fromkeys(s.value for r in DECISIONS.values() if r.action == request.action for s in r.applies_to)
            )
            raise ValueError(
                f"cannot reconcile step {request.step_id!r} with {request.action}: it is {status.value}, not {allowed}"
            )
        return kind

    async def _cancel(self, payload: dict[str, Any]) -> dict[str, Any]:
        request = parse_payload(CancelRequest, payload, "cancel")
        signed = signed_decision("cancel", request)
        # Answered at once: the cancel is in the ledger, and a running attempt stops at its next renewal.
        if request.step_id is not None:
            await self._cancel_calls([request.step_id], request, signed)
        else:
            await self._cancel_run(request, signed)
            self._run.end(RunState.CANCELLED)
        return self._answer()

    def _validate_cancel(self, payload: dict[str, Any]) -> None:
        request = parse_payload(CancelRequest, payload, "cancel")
        run = self._run
        if run.state.ended:
            raise ValueError(f"run {run.run_id} has ended ({run.state.value}); there is nothing to cancel")
        if request.step_id is not None:
            self._require(request.step_id, DecisionKind.CANCEL)
        elif all(view.status.is_terminal for view in run.tasks.values()):
            raise ValueError(_NOTHING_TO_CANCEL.format(run=run.run_id))

    async def _cancel_calls(self, targets: list[str], request: CancelRequest, signed: dict[str, Any]) -> None:
        """Cancel each of ``targets`` in the ledger first (G8), then its running activity."""
        for step_id in targets:
            await self.apply(self._steps[step_id], DecisionKind.CANCEL, request.by, request.reason, **signed)
            handle = self._running.get(step_id)
            if handle is not None:
                handle.cancel()

    async def _cancel_run(self, request: CancelRequest, signed: dict[str, Any]) -> None:
        """Cancel the run's first open call (its signature is checked there), then the run and every other."""
        done: list[str] = []
        tasks = self._run.tasks
        while targets := [sid for sid, view in tasks.items() if not view.status.is_terminal and sid not in done]:
            await self._cancel_calls(targets[:1], request, signed)
            self.cancelled = True
            done.append(targets[0])
        if not done:
            raise ApplicationError(_NOTHING_TO_CANCEL.format(run=self._run.run_id), type=FailureType.DECISION_REFUSED)

    async def stop_calls(self, reason: str) -> None:
        """Cancel every task that is not final in the ledger, then its activity, and wait until each stopped."""
        self.cancelled = True
        tasks = self._run.tasks
        targets = [sid for sid, view in tasks.items() if not view.status.is_terminal and sid in self._steps]
        for sid in targets:
            if sid not in self._cancelling and not tasks[sid].status.is_terminal:
                await self._cancel_in_ledger(self._steps[sid], reason)
            handle = self._running.get(sid)
            if handle is not None:
                handle.cancel()
        await workflow.wait_condition(lambda: not self._in_flight)
        self._run.refresh_waiting()

    async def cancelled_with_the_run(self, step: PlanStep) -> None:
        """The call's activity was cancelled with its workflow or agent run: cancel its task in the ledger too."""
        sid = step.step_id
        if sid in self._cancelling:
            await workflow.wait_condition(lambda: sid not in self._cancelling)
            return
        await self._cancel_in_ledger(step, "its workflow (or agent run) was cancelled while it ran")

    async def _cancel_in_ledger(self, step: PlanStep, reason: str) -> None:
        """The run's own cancel of one task (unsigned: it answers Temporal's cancellation of the run)."""
        sid = step.step_id
        self._cancelling.add(sid)
        try:
            await self.apply(step, DecisionKind.CANCEL, RUN_DECIDER, reason, run_own=True)
        except ActivityError as exc:  # the task got further first (it settled): the ledger's word stands
            workflow.logger.info("cancel of step %s with its run not applied: %s", sid, exc.cause or exc)
        finally:
            self._cancelling.discard(sid)

    async def on_decide(self, payload: Any) -> None:
        """The ``decide`` signal: the decision update of the same name, or a recorded refusal."""
        if (why := undecodable(payload)) is not None:  # refused alone; the run goes on (agentlease.security.codec)
            await self._refuse("", {}, f"undecodable payload: {why}")
            return
        body = dict(payload) if isinstance(payload, dict) else {}
        decision = str(body.pop("decision", "") or "")[:50]
        try:
            if decision not in self.updates:
                raise ValueError(
                    f"unknown decision {decision!r}; a decide signal carries one of {', '.join(self.updates)}"
                )
            handler, validator = self.updates[decision]
            validator(body)
        except ValueError as exc:
            await self._refuse(decision, body, str(exc))
            return
        try:
            await handler(body)
        except (ActivityError, ApplicationError, ValueError) as exc:  # the ledger refused it, or nothing to do
            await self._refuse(decision, body, str(getattr(exc, "cause", None) or exc))

    async def _refuse(self, decision: str, body: dict[str, Any], refusal: str) -> None:
        """Keep a refused ``decide`` signal for ``status`` and write it to the step's evidence trail."""
        step_id = body.get("step_id") if isinstance(body.get("step_id"), str) else None
        by = body.get("by") if isinstance(body.get("by"), str) else None
        refused = RefusedDecision(
            decision=decision or "?", step_id=step_id and step_id[:128], by=by and by[:200], refusal=refusal[:2000]
        )
        self._run.refused_signal(refused)
        workflow.logger.warning("refused %s signal for step %s: %s", refused.decision, step_id, refusal)
        # Written to the trail as one summary at most once a minute (or with the run's next decision).
        if step_id in self._steps:
            if not self._unrecorded:
                self._unrecorded_since = workflow.now()
            self._unrecorded = [*self._unrecorded, refused][-KEPT_REFUSALS:]
            self._unrecorded_total += 1
        if self._unrecorded and (self._last_flush is None or workflow.now() - self._last_flush >= _REFUSAL_FLUSH):
            await self._flush_refusals()
        self._run.show_details()

    async def _flush_refusals(self) -> None:
        """Write the refused signals not yet recorded as one ``decision_refused`` summary on the last one's step."""
        pending, total, since = self._unrecorded, self._unrecorded_total, self._unrecorded_since
        self._unrecorded, self._unrecorded_total, self._unrecorded_since = [], 0, None
        self._last_flush = workflow.now()
        if not pending or self._recorded_summaries >= _MAX_RECORDED_REFUSALS:
            return
        last = pending[-1]
        step = self._steps.get(last.step_id or "")
        task = None if step is None else self._task_of(step)
        if task is None:
            return
        self._recorded_summaries += 1
        when = since.isoformat(timespec="seconds") if since is not None else "?"
        text = last.refusal if total == 1 else f"{total} decide signals refused since {when}; the last: {last.refusal}"
        try:
            await workflow.execute_activity(
                RECORD_REFUSAL,
                LedgerRefusal(task=task, decision=last.decision, by=last.by, refusal=text[:2000]).model_dump(
                    mode="json"
                ),
                start_to_close_timeout=_DECISION_TIMEOUT,
                retry_policy=_DECISION_RETRY,
                summary=f"{task.step_id}: refused {last.decision} signal",
            )
        except ActivityError as exc:  # a signal handler must not fail the run: the status keeps it
            workflow.logger.warning("refused signals not written to the trail: %s", exc)


def _decision_text(step_id: str, kind: DecisionKind) -> str:
    """``publish: approved`` (at most 250 characters; who and why are in the evidence trail)."""
    rule = DECISIONS[kind]
    verb = rule.event.value if rule.action is None else f"{rule.event.value} ({rule.action})"
    return f"{step_id}: {verb}"[:_MAX_DECISION_CHARS]


def _ended_by(status: TaskStatus, by: str, reason: str) -> str | None:
    """A decision that ended a task without settling it, as its view's ``error``: ``"rejected by alice: why"``."""
    if status.is_terminal and status is not TaskStatus.SETTLED:
        done = "cancelled" if status.is_cancelled else status.value  # the status says whether its effect is known
        return f"{done} by {by}: {reason}"
    return None


__all__ = ["DECISION_UPDATES", "RunDecisions"]
