"""Leased tool calls from inside any workflow: the call path (scheduling, attempts, failures, action keys).

Deterministic orchestration only. A workflow's first leased call makes its one :class:`LeasedToolCalls`, which
installs the operator view (``docs/operator-views.md``) and the decisions (``docs/decisions.md``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from agentlease.decisions.table import RUN_DECIDER
    from agentlease.enums import DecisionKind, FailureType, RunState, Stage, StepEnd, StepStatus, TaskStatus
    from agentlease.errors import describe_validation_error
    from agentlease.limits import MAX_WORKFLOW_ID_CHARS
    from agentlease.records import (
        ApprovalRequest,
        ApprovalRule,
        PlanStep,
        RunCarry,
        RunStatus,
        TaskSpec,
        TaskView,
        ToolCall,
        ToolInfo,
        ToolOutcome,
        approvals_required,
        arguments_fingerprint,
        idempotency_key_for,
        scoped_idempotency_key,
        step_id_from,
        task_id_for,
        wire_part,
    )
    from agentlease.runtime.names import DECIDE_SIGNAL, LEASE_PROGRESS_SIGNAL, STATUS_QUERY
    from agentlease.security.redaction import redact
    from agentlease.workflow._catalog import RunCatalog
    from agentlease.workflow._decisions import RunDecisions
    from agentlease.workflow._handlers import resolved
    from agentlease.workflow._options import leased_activity_options
    from agentlease.workflow._status import RunView
    from agentlease.workflow._versions import BELOW_FLOOR, ReplayFloorError, at_replay_floor


ResultT = TypeVar("ResultT")


class LeasedCallError(ValueError):
    """A leased call the run cannot make: its step id is already used, its tool is unknown, or it is beyond
    the limits of ``docs/limits.md``. ``AgentLeasePlugin`` makes it fail the run instead of its workflow task."""


@dataclass(frozen=True)
class CallOutcome:
    """How one leased call ended: ``view``, the task as the run shows it (status, stage, generation, attempts,
    receipt, error), and ``output``, the tool's output when it settled in this run (``None`` otherwise)."""

    view: TaskView
    output: dict[str, Any] | None = None

    @property
    def settled(self) -> bool:
        return self.view.status is TaskStatus.SETTLED


class LeasedToolCalls:
    """The leased tool calls of the running workflow: exactly one per run, from workflow code (:func:`leased_calls`).
    ``catalog``: the tools this workflow may call; default learnt from the worker with :meth:`load_catalog`."""

    def __init__(self, catalog: Iterable[ToolInfo] | None = None) -> None:
        self.run_id = workflow.info().workflow_id
        self._steps: dict[str, PlanStep] = {}
        self._running: dict[str, workflow.ActivityHandle[dict[str, Any]]] = {}
        self._keys_in_use: dict[str, str] = {}  # key -> the step that runs under it now (a second call waits)
        self._in_flight: set[str] = set()  # steps whose attempt is under way, until its outcome is recorded
        self._below_floor = not at_replay_floor()  # the run's first command: the floor's marker
        if workflow.instance() is not None:  # in @workflow.init, the interceptor checks (see check_replay_floor)
            self.check_replay_floor()
        self._run = RunView(self.run_id, self._running)
        self._decisions = RunDecisions(self._run, self._steps, self._running, self._in_flight, self._task_of)
        workflow.set_query_handler(STATUS_QUERY, resolved(self._run.status_query))
        for command, (handler, validator) in self._decisions.updates.items():
            workflow.set_update_handler(command, resolved(handler), validator=validator)
        workflow.set_signal_handler(LEASE_PROGRESS_SIGNAL, resolved(self._run.on_progress))
        workflow.set_signal_handler(DECIDE_SIGNAL, resolved(self._decisions.on_decide))
        self._catalog = RunCatalog(self._run, catalog)

    def check_replay_floor(self) -> None:
        """Raise ``ReplayFloorError`` for a history recorded below the replay floor (:mod:`._versions`): when the
        calls are made, or (made in ``@workflow.init``) from ``AgentLeasePlugin``'s interceptor as the run starts."""
        if self._below_floor:
            raise ReplayFloorError(BELOW_FLOOR)

    @property
    def closed(self) -> bool:
        """The run takes no more calls (shown by the ``status`` query)."""
        return self._run.closed

    @closed.setter
    def closed(self, closed: bool) -> None:
        self._run.closed = closed

    @property
    def cancelled(self) -> bool:
        """An operator cancelled the whole run, or its workflow was cancelled: no further call runs."""
        return self._decisions.cancelled

    @property
    def state(self) -> RunState:
        return self._run.state

    def end(self, state: RunState) -> None:
        """The run ended (completed, cancelled or failed): no more calls or decisions."""
        self._run.end(state)

    def status(self) -> RunStatus:
        """The run as the ``status`` query reports it."""
        return self._run.status()

    def current_details(self) -> str:
        """The run's current details text (the Temporal UI shows it on the run's page), one line each."""
        return self._run.current_details()

    def show_search_attributes(self) -> None:
        """Upsert the search attributes whose value changed since last shown, in one command (the calls do it when
        they wait, return and end; a workflow that waits on something of its own between calls may call it)."""
        self._run.show()

    async def stop_calls(self, reason: str = "its workflow was cancelled") -> None:
        """Stop the run's leased calls because its workflow (or agent run) was cancelled: each task that is not final
        is cancelled in the ledger first (G8), then its activity, and this waits until each stopped, ``reason``
        recorded (``docs/decisions.md``). Call it where your own workflow catches ``asyncio.CancelledError``."""
        await self._decisions.stop_calls(reason)

    async def run_to_end(self, run: Callable[..., Awaitable[ResultT]], *args: Any, **kwargs: Any) -> ResultT:
        """``await run(*args, **kwargs)`` (an agent run), then end the run: ``completed`` (``cancelled`` when an
        operator cancelled it), ``failed`` when it raised (re-raised), ``cancelled`` after :meth:`stop_calls`."""
        try:
            result = await run(*args, **kwargs)
        except asyncio.CancelledError:  # the workflow (or the agent run) was cancelled: its calls stop first
            await self.stop_calls()
            self.end(RunState.CANCELLED)
            raise
        except Exception:  # not GeneratorExit nor an eviction: the run did not end, its coroutine was closed
            self.end(RunState.FAILED)
            raise
        self.end(RunState.CANCELLED if self.cancelled else RunState.COMPLETED)
        return result

    async def load_catalog(self) -> dict[str, ToolInfo]:
        """Learn the worker's tools (a local activity, recorded in history) and start running
        (:meth:`~agentlease.workflow._catalog.RunCatalog.load`: its errors)."""
        return await self._catalog.load(self._steps)

    def register(self, info: ToolInfo) -> None:
        """Make a tool the workflow declares itself callable (a framework adapter's tool)."""
        self._catalog.register(info)

    def known_tools(self) -> list[str] | None:
        """The tools this run may call, once known."""
        return None if self._catalog.tools is None else sorted(self._catalog.tools)

    def add(self, step: PlanStep) -> TaskView:
        """Register a step (``pending``) without running it; its task and key are fixed here (G4)."""
        view = TaskView(
            task_id=task_id_for(self.run_id, step.step_id),
            step_id=step.step_id,
            tool=step.tool,
            status=TaskStatus.PENDING,
            idempotency_key=idempotency_key_for(self.run_id, step.step_id)
            if step.idempotency_key is None
            else scoped_idempotency_key(self.run_id, step.idempotency_key, shared=step.share_idempotency_key),
        )
        self._steps[step.step_id] = step
        self._run.tasks[step.step_id] = view
        return view

    def has_step(self, step_id: str) -> bool:
        return step_id in self._run.tasks

    def restore(self, steps: Iterable[PlanStep], carried: RunCarry) -> None:
        """Take up the steps and views of the run this one continues (``ValueError``: they name other step ids)."""
        by_id = {step.step_id: step for step in steps}
        if [view.step_id for view in carried.views] != list(by_id) or carried.next_step > len(by_id):
            raise ValueError("bad plan payload: carried views do not match the plan's steps")
        self._steps.update(by_id)
        self._run.tasks.update((view.step_id, view) for view in carried.views)

    def carry(self, next_step: int) -> tuple[list[PlanStep], RunCarry]:
        """The steps and views to continue as new with: the arguments of the steps before ``next_step``
        are left out (none of them runs again; decisions do not read arguments)."""
        steps = [
            step.model_copy(update={"arguments": {}}) if index < next_step else step
            for index, step in enumerate(self._steps[sid] for sid in self._run.tasks)
        ]
        return steps, RunCarry(views=list(self._run.tasks.values()), next_step=next_step)

    def unique_step_id(self, text: str) -> str:
        """A valid step id made from ``text`` that no step of this run uses yet (``-2``, ``-3``... appended)."""
        base = step_id_from(text)
        candidate, n = base, 1
        while candidate in self._run.tasks:
            n += 1
            candidate = step_id_from(f"{base}-{n}")
        return candidate

    def step_ids(self) -> list[str]:
        """Step ids in the order they were added."""
        return list(self._run.tasks)

    def view(self, step_id: str) -> TaskView:
        return self._run.tasks[step_id]

    def skip(self, step_id: str) -> None:
        """Mark a step that will never start (a later step of a failed run)."""
        self._run.update(step_id, status=StepEnd.SKIPPED)

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        step_id: str,
        idempotency_key: str | None = None,
        share_idempotency_key: bool = False,
    ) -> CallOutcome:
        """Run one leased call of a catalog ``tool`` until its task is final (the other arguments, the outcome and
        ``LeasedCallError`` as for :func:`agentlease.workflow.call_tool`), waiting for people where needed."""
        if step_id in self._run.tasks:
            raise LeasedCallError(f"step id {step_id!r} is already used in run {self.run_id}")
        if len(self.run_id) > MAX_WORKFLOW_ID_CHARS:
            raise LeasedCallError(
                f"workflow id of {len(self.run_id)} characters: leased calls take at most {MAX_WORKFLOW_ID_CHARS}"
            )
        if await self._catalog.find(tool, self._steps) is None:
            raise LeasedCallError(f"unknown tool {tool!r}; known tools: {', '.join(self.known_tools() or ())}")
        try:
            step = PlanStep(
                step_id=step_id,
                tool=tool,
                arguments=arguments,
                idempotency_key=idempotency_key,
                share_idempotency_key=share_idempotency_key,
            )
        except ValidationError as exc:
            raise LeasedCallError(f"bad leased call {step_id!r}: {describe_validation_error(exc)}") from None
        self.add(step)
        outcome = await self.run_step(step_id)
        self._run.show()
        return outcome

    async def run_step(self, step_id: str) -> CallOutcome:
        """Run a registered step until it is final (see :meth:`call`), keyed by its tool's action key if it has no
        key; while another step runs under the same key, it waits for that one to end."""
        step = self._steps[step_id]
        if self._run.tasks[step_id].status.is_terminal:
            return CallOutcome(self._run.tasks[step_id])  # cancelled before it started
        if self.cancelled:
            return CallOutcome(self._run.update(step_id, status=TaskStatus.CANCELLED, error="the run was cancelled"))
        assert self._catalog.tools is not None, "load_catalog() first"
        info = self._catalog.tools[step.tool]
        failed = self._action_key(step_id, info)
        if failed is not None:
            return CallOutcome(failed)
        step = self._steps[step_id]
        key = self._run.tasks[step_id].idempotency_key
        while key in self._keys_in_use:  # one at a time: the next one finds the first's receipt
            await workflow.wait_condition(lambda: key not in self._keys_in_use)
        self._keys_in_use[key] = step_id
        try:
            return await self._run_step(step, info)
        finally:
            if self._keys_in_use.get(key) == step_id:
                del self._keys_in_use[key]

    def _action_key(self, step_id: str, info: ToolInfo) -> TaskView | None:
        """Give a step its tool's normalized arguments (``ToolInfo.arguments_of``) and, when it has no key, its
        tool's action key (its digest when it cannot be a key on the wire); the failed view when it cannot."""
        step = self._steps[step_id]
        keyed = step.idempotency_key is None and info.action_key is not None
        try:
            arguments = info.arguments_of(step.arguments)
            key = wire_part(info.key_for(arguments) or "") if keyed else step.idempotency_key
            step = PlanStep.model_validate({**step.model_dump(), "arguments": arguments, "idempotency_key": key})
        except (ValueError, ValidationError) as exc:
            why = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
            what = "no action key" if keyed else "bad arguments"
            return self._run.update(step_id, status=StepEnd.FAILED, error=f"{what} for {step.tool}: {why}")
        self._steps[step_id] = step
        if keyed:
            scoped = scoped_idempotency_key(self.run_id, key or "", shared=step.share_idempotency_key)
            self._run.update(step_id, idempotency_key=scoped)
        return None

    async def _run_step(self, step: PlanStep, info: ToolInfo) -> CallOutcome:
        step_id = step.step_id
        self._run.step_started(step.tool)
        asked = info.approval_reason(step.arguments)
        if asked is not None:
            rule = info.requires_approval if isinstance(info.requires_approval, ApprovalRule) else None
            request = ApprovalRequest(
                tool=step.tool,
                arguments=redact(step.arguments),
                arguments_sha256=arguments_fingerprint(step.arguments),
                approvals_required=approvals_required(info.requires_approval),
            )
            self._run.update(step_id, approval_request=request)
            parked = await self._decisions.apply(
                step, DecisionKind.AWAIT_APPROVAL, RUN_DECIDER, asked, request=request, rule=rule
            )
            if parked.status is not TaskStatus.SETTLED:  # settled: its approved call ran before a reset
                await self._wait_for_person(step_id)
                if self._run.tasks[step_id].status.is_terminal:
                    return CallOutcome(self._run.tasks[step_id])
        while True:
            outcome = await self._attempt(step, info)
            status = outcome.view.status
            if status.awaits_decision:
                await self._wait_for_person(step_id)
                status = self._run.tasks[step_id].status
            if not (isinstance(status, TaskStatus) and status.claimable):
                return CallOutcome(self._run.tasks[step_id], outcome.output)

    async def _wait_for_person(self, step_id: str) -> None:
        waiting = self._run.tasks[step_id].status
        self._run.refresh_waiting()
        self._run.show()
        await workflow.wait_condition(lambda: self._run.tasks[step_id].status != waiting)
        self._run.refresh_waiting()

    async def _attempt(self, step: PlanStep, info: ToolInfo) -> CallOutcome:
        """Execute the leased activity once (Temporal retries inside)."""
        sid = step.step_id
        self._in_flight.add(sid)
        try:
            self._run.update(sid, status=TaskStatus.RUNNING)
            options = leased_activity_options(info)
            call = self._tool_call(step, progress_key=await self._run.proofs.call_key(sid))
            handle = workflow.start_activity(
                step.tool,
                call.model_dump(mode="json"),
                heartbeat_timeout=options.heartbeat_timeout,
                start_to_close_timeout=options.start_to_close_timeout,
                retry_policy=options.retry_policy,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                result_type=dict,
                summary=f"{sid}: {step.tool}",
            )
            self._running[sid] = handle
            self._run.show_details()  # the search attributes follow its first progress signal or its end
            try:
                outcome = ToolOutcome.model_validate(await handle)
            except ActivityError as err:
                self._running.pop(sid, None)
                if isinstance(err.cause, CancelledError) and not self._run.tasks[sid].status.is_cancelled:
                    await self._decisions.cancelled_with_the_run(step)
                return CallOutcome(self._failed(sid, err))
            finally:
                self._running.pop(sid, None)
            if self._run.tasks[sid].status.is_cancelled:
                return CallOutcome(self._run.tasks[sid])
            return CallOutcome(self._run.attempt_ended(sid, outcome), outcome.result)
        finally:
            self._in_flight.discard(sid)

    def _failed(self, step_id: str, err: ActivityError) -> TaskView:
        """The view of a step whose attempt failed: the status its failure reports."""
        if self._run.tasks[step_id].status.is_cancelled:
            return self._run.tasks[step_id]
        cause = err.cause
        if isinstance(cause, CancelledError):
            return self._run.update(step_id, status=TaskStatus.CANCELLED, error=cause.message)
        if not isinstance(cause, ApplicationError):
            return self._run.update(step_id, status=StepEnd.FAILED, error=str(err))
        facts: dict[str, Any] = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
        failure = FailureType.parse(cause.type)
        status: StepStatus = StepEnd.FAILED
        if failure is not None and failure.status is not None:
            status = failure.status
        elif failure is FailureType.TASK_CLOSED and facts.get("status") in TaskStatus.__members__.values():
            status = TaskStatus(facts["status"])
        asked = self._run.tasks[step_id].approval_request
        if status is TaskStatus.AWAITING_APPROVAL and asked is not None and asked.approved_by:
            # the claim refused the approval (expired): it is asked for again, from no approval
            asked = asked.model_copy(update={"approved_by": [], "expires_at": None})
        return self._run.update(
            step_id,
            approval_request=asked,
            status=status,
            error=cause.message,
            stage=Stage(facts["stage"]) if facts.get("stage") else None,
            claim_generation=facts.get("claim_generation"),
            attempts=facts.get("attempts"),
        )

    def _tool_call(self, step: PlanStep, *, progress_key: str | None = None) -> ToolCall:
        """The leased activity's input for ``step`` (G4), with the key its progress signals are proven with."""
        view = self._run.tasks[step.step_id]
        return ToolCall(
            task_id=view.task_id,
            agent_run_id=self.run_id,
            step_id=step.step_id,
            tool=step.tool,
            arguments=step.arguments,
            idempotency_key=view.idempotency_key,
            share_idempotency_key=step.share_idempotency_key,
            progress_key=progress_key,
        )

    def _task_of(self, step: PlanStep) -> TaskSpec | None:
        """What the ledger records of ``step``'s task (for a decision); ``None`` while its tool is unknown."""
        info = None if self._catalog.tools is None else self._catalog.tools.get(step.tool)
        return None if info is None else TaskSpec.of(self._tool_call(step), info.side_effect_class, info.lease_ttl)


_INSTANCE_ATTRIBUTE = "__agentlease_calls__"


def leased_calls(catalog: Iterable[ToolInfo] | None = None) -> LeasedToolCalls:
    """The running workflow's :class:`LeasedToolCalls`, made (its handlers installed) on first use, with the tools
    of ``catalog`` made callable. In ``@workflow.init`` (no workflow object yet) keep the result in an attribute
    (``self.calls = leased_calls()``), where later calls find it."""
    instance = workflow.instance()
    calls = attached_calls(instance)
    if calls is None:
        calls = LeasedToolCalls(catalog)
        catalog = None
        if instance is not None:
            setattr(instance, _INSTANCE_ATTRIBUTE, calls)
    for info in catalog or ():
        calls.register(info)
    return calls


def attached_calls(instance: object | None) -> LeasedToolCalls | None:
    """The :class:`LeasedToolCalls` the workflow object holds (made by ``leased_calls`` or kept by its ``__init__``)."""
    if instance is None:
        return None
    found = getattr(instance, _INSTANCE_ATTRIBUTE, None)
    if isinstance(found, LeasedToolCalls):
        return found
    return next((v for v in getattr(instance, "__dict__", {}).values() if isinstance(v, LeasedToolCalls)), None)


__all__ = ["CallOutcome", "LeasedCallError", "LeasedToolCalls", "attached_calls", "leased_calls"]
