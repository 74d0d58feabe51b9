"""Leased tool calls from inside any workflow: scheduling, waiting for people, decisions, status.

Deterministic orchestration only. A workflow's first leased call makes its one
:class:`LeasedToolCalls` (:func:`leased_calls`); that installs, on the running workflow, what an
operator talks to:

- query ``status`` -> :class:`~agentlease.records.RunStatus`;
- updates ``approve`` / ``reject`` / ``redrive`` (:class:`~agentlease.decisions.DecisionRequest`),
  ``reconcile`` (:class:`~agentlease.decisions.ReconcileRequest`), ``cancel``
  (:class:`~agentlease.decisions.CancelRequest`) -> ``RunStatus``; their validators refuse what the
  decision table (:data:`~agentlease.decisions.DECISIONS`) does not allow, so a refused update
  leaves no history;
- the search attributes ``AgentLeaseStatus``, ``AgentLeaseWaitingReason``, ``AgentLeaseTool`` and
  ``AgentLeaseStage`` (and, on runs made with :data:`LIVE_PATCH`, ``AgentLeaseGeneration``,
  ``AgentLeaseOwner``, ``AgentLeaseDecision``), and the run's current details text;
- signal ``agentlease.lease_progress`` (:class:`~agentlease.records.LeaseProgress`), from the run's
  own leased activities: the live stage, generation and owner the ledger recorded, and the late writes
  it refused; on runs made with :data:`~agentlease.workflow._progress.PROOF_PATCH` only a signal proven
  with its call's key is believed (:mod:`agentlease.workflow._progress`);
- signal ``decide``: the same decisions for clients that only signal (``{"decision": "approve",
  ...the update's payload}``); a refused one is written to the evidence trail and shown by ``status``.
  ``docs/operator-views.md`` describes what an operator sees where.

On a worker with :class:`~agentlease.plugin.AgentLeasePlugin` the ``status`` query and the decision
updates answer from the start of every workflow, before its first leased call
(:class:`LeasedCallsInterceptor`): the query with the run ``starting`` and no task, the updates with
a refusal (there is no step to decide on); signals wait, buffered by Temporal, for the first call.
A workflow need not call :func:`leased_calls` itself; calling it (in ``@workflow.init``) is harmless.

Each call (:meth:`LeasedToolCalls.call`) is a task ``<workflow id>/<step id>`` with the idempotency
key ``<workflow id>:<step id>`` unless the caller gives one (G4); a caller's key is scoped to the run,
``<workflow id>:<key>``, unless the caller shares it across runs (``share_idempotency_key``,
``docs/security.md``). It runs as the tool's leased
activity with heartbeat timeout = lease TTL (G9) until the task is final; when the task needs a
person (approval, reconciliation, blocked, dead-lettered) the call waits for that person's decision.
Every decision is written to the ledger's evidence trail with who made it and why.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from types import CodeType
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from agentlease import search_attributes as sa
    from agentlease.codec import undecodable
    from agentlease.decision_auth import signed_decision
    from agentlease.decisions import (
        DECISIONS,
        CancelRequest,
        DecisionRequest,
        LedgerDecision,
        LedgerRefusal,
        ReconcileRequest,
    )
    from agentlease.enums import DecisionKind, FailureType, RunState, Stage, StepEnd, StepStatus, TaskStatus
    from agentlease.errors import describe_validation_error
    from agentlease.limits import MAX_WORKFLOW_ID_CHARS
    from agentlease.names import (
        APPLY_DECISION,
        DECIDE_SIGNAL,
        DESCRIBE_RUN,
        DESCRIBE_TOOLS,
        LEASE_PROGRESS_SIGNAL,
        RECORD_REFUSAL,
        STATUS_QUERY,
    )
    from agentlease.records import (
        PlanStep,
        RefusedDecision,
        RunCarry,
        RunStatus,
        TaskSpec,
        TaskView,
        ToolCall,
        ToolInfo,
        ToolOutcome,
        arguments_fingerprint,
        idempotency_key_for,
        scoped_idempotency_key,
        step_id_from,
        task_id_for,
    )
    from agentlease.redaction import redact
    from agentlease.workflow._options import leased_activity_options
    from agentlease.workflow._progress import PROOF_PATCH, ProgressProofs, refused_writes_line

ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_payload(model: type[ModelT], payload: Any, what: str) -> ModelT:
    """A handler's payload as ``model``, or a ``ValueError`` naming what is wrong (a refused update).

    Handlers take plain JSON so that they work under any payload converter, and validate here.
    """
    if isinstance(payload, model):
        return payload
    if (why := undecodable(payload)) is not None:  # a worker's codec could not open it (agentlease.codec)
        raise ValueError(f"undecodable {what} payload: {why}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ValueError(f"bad {what} payload: {describe_validation_error(exc)}") from None


CATALOG_PATIENCE = timedelta(seconds=30)
"""How long after its start a run waits for a worker that serves its tools (see
:meth:`LeasedToolCalls.load_catalog`). Default 30s."""

_CATALOG_PATIENCE_PATCH = "agentlease-catalog-patience"
"""Patch: a worker without a run's tools fails its workflow task instead of the run (runs recorded
before failed at once)."""

_END_ON_RETURN_PATCH = "agentlease-end-on-return"
"""Patch: a workflow whose run returns or raises ends its leased calls' state (``completed``, ``failed``,
``cancelled``) itself, with no ``run_agent`` (runs recorded before kept ``running``)."""

_LEARN_NAMED_TOOL_PATCH = "agentlease-learn-named-tool"
"""Patch: a call naming a tool the workflow did not declare learns the worker's catalog once, beside the
declared tools (runs recorded before failed the call as an unknown tool)."""


class LeasedCallError(ValueError):
    """A leased call the run cannot make: its step id is already used, its tool is unknown, or it is
    beyond the limits of ``docs/limits.md``. ``AgentLeasePlugin`` declares it a workflow failure: a run
    that lets it propagate fails with this one line instead of retrying its workflow task forever."""


class ToolsNotServedHereError(RuntimeError):
    """This worker does not serve a tool of the run: the workflow task fails (Temporal retries it,
    on any worker of the queue); nothing is recorded in the run's history."""


COALESCE_PATCH = "agentlease-coalesced-search-attributes"
"""The patch id of coalesced search-attribute upserts (:meth:`LeasedToolCalls._set_state`)."""
BASELINE_PATCH = "agentlease-baseline-1"
"""Patch: the run has the change of every patch asked for through :meth:`LeasedToolCalls.patched` (all those
of :mod:`agentlease.workflow` before it but the catalog's patience, which is never recorded) with one marker,
and a call's search attributes are upserted when its attempt's first progress signal arrives or when it
ends, not also when it is scheduled. Each patch asked for costs a new run a marker and an upsert of
``TemporalChangeVersion``; a run made with this one asks for no other. Runs recorded before asked for each
change on its own and replay as they were."""

_DECISION_TIMEOUT = timedelta(seconds=30)
_DESCRIBE_TIMEOUT = timedelta(seconds=30)
_DECISION_RETRY = RetryPolicy(
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,
    non_retryable_error_types=[FailureType.DECISION_REFUSED.value],
)
"""A decision is written to the ledger however long an outage lasts (attempts every 10 s at most)."""
ACTION_KEY_PATCH = "agentlease-action-keys"
"""Patch: a call the caller gives no key is keyed by its tool's declared action key, and a call waits while
another call of the run with the same key is under way (runs recorded before used ``<run>:<step>``)."""
CANCEL_IN_LEDGER_PATCH = "agentlease-cancel-in-ledger"
"""Patch: a leased call cancelled with its workflow (or its agent run) is cancelled in the ledger too, and the
run waits for it to stop (runs recorded before left the attempt's own release: ``released``)."""
_CANCEL_ANSWERS_AT_ONCE = "agentlease-cancel-answers-at-once"
"""Patch: ``cancel`` answers once the ledger recorded it, without waiting for the activity (0.2.0)."""
_CANCEL_VERIFIED_FIRST = "agentlease-cancel-verified-first"
"""Patch: a whole-run cancel cancels the run only once the ledger applied it to a first call (its signature
checked there), and is refused when no call is open (nothing would check it). Runs recorded before marked
the run cancelled before any check, and a cancel with no open call ended the run unchecked."""
_NOTHING_TO_CANCEL = (
    "run {run} has no open call to cancel: a whole-run cancel is applied, and its signature checked, on the "
    "calls it cancels; to stop the run, close it (keep_open) or cancel its workflow in Temporal"
)
_RUN_DECIDER = "agentlease"
"""Who the evidence trail names for decisions the run makes itself (parking an approval-gated call)."""
LIVE_PATCH = "agentlease-live-lease-view"
"""Patch: the run shows its attempts' live progress and its last decision in search attributes (0.3.0)."""
SETTLED_OWNER_PATCH = "agentlease-settled-owner"
"""Patch: a call's end shows the owner (and claim time) of the generation that ended it, the next step starts
with no owner, and ``AgentLeaseGeneration`` keeps the highest generation any call of the run reached (runs
recorded before kept the last progress signal's owner and the last step's generation)."""
DECISION_UPDATES = ("approve", "reject", "redrive", "reconcile", "cancel")
"""The decision updates a run with leased calls takes."""
_KEPT_REFUSALS = 20
"""How many refused ``decide`` signals the ``status`` query keeps (the evidence trail keeps a summary)."""
BOUNDED_SIGNALS_PATCH = "agentlease-bounded-signals"
"""Patch: refused ``decide`` signals are counted and written to the trail as one summary at most once a
minute (or with the run's next decision), at most :data:`_MAX_RECORDED_REFUSALS` per run; decisions are
shown without who and why in search attributes, and stage reasons and notes redacted (runs recorded
before wrote one trail entry, an activity, per refused signal)."""
_MAX_RECORDED_REFUSALS = 100
"""How many refusal summaries one run writes to the trail at most (the count goes on in ``status``)."""
_REFUSAL_FLUSH = timedelta(minutes=1)
_MAX_DECISION_CHARS = 250


@dataclass(frozen=True)
class CallOutcome:
    """How one leased call ended.

    Attributes:
        view: the task as the run shows it (status, stage, generation, attempts, receipt, error).
        output: the tool's output when it settled in this run; ``None`` otherwise.
    """

    view: TaskView
    output: dict[str, Any] | None = None

    @property
    def settled(self) -> bool:
        return self.view.status is TaskStatus.SETTLED


class LeasedToolCalls:
    """The leased tool calls of the running workflow (see the module docstring).

    Make exactly one per workflow run, from workflow code.

    Args:
        catalog: the tools this workflow may call, by name; default learnt from the worker with
            :meth:`load_catalog`.
    """

    def __init__(self, catalog: Iterable[ToolInfo] | None = None) -> None:
        self.run_id = workflow.info().workflow_id
        self.closed = False
        """The run takes no more calls (shown by the ``status`` query)."""
        self.cancelled = False
        """An operator cancelled the whole run: no further call runs."""
        self._state = RunState.STARTING
        self._catalog: dict[str, ToolInfo] | None = None if catalog is None else {i.name: i for i in catalog}
        self._learnt = False
        """The worker's catalog was learnt (``describe_tools``), not only the tools the workflow declared."""
        self._steps: dict[str, PlanStep] = {}
        self._views: dict[str, TaskView] = {}
        self._running: dict[str, workflow.ActivityHandle[dict[str, Any]]] = {}
        self._keys_in_use: dict[str, str] = {}
        """Idempotency key -> the step that runs under it now (a second call of the key waits)."""
        self._in_flight: set[str] = set()
        """Steps whose attempt is under way, until its outcome (a cancel included) is recorded."""
        self._cancelling: set[str] = set()
        """Steps the run is cancelling in the ledger because its workflow (or agent run) was cancelled."""
        self._shown: dict[str, Any] = {}
        self._wanted: dict[str, Any] = {}
        self._baseline = workflow.patched(BASELINE_PATCH)
        self._coalesce = self.patched(COALESCE_PATCH)
        self._live = self.patched(LIVE_PATCH)
        self._settled_owner = self.patched(SETTLED_OWNER_PATCH)
        self._highest_generation = 0
        """The highest claim generation any call of the run reached (``AgentLeaseGeneration``)."""
        self._last_decision: str | None = None
        self._refused: list[RefusedDecision] = []
        self._bounded = self.patched(BOUNDED_SIGNALS_PATCH)
        self._refused_count = 0
        """Refused ``decide`` signals of this run, all told."""
        self._unrecorded: list[RefusedDecision] = []
        """Refused signals not yet in a trail summary (the first one's time in :attr:`_unrecorded_since`)."""
        self._unrecorded_since: Any = None
        self._unrecorded_total = 0
        self._recorded_summaries = 0
        self._last_flush: Any = None
        self._proofs = ProgressProofs(self.patched(PROOF_PATCH))
        """Which progress signals the run believes, and how many it dropped."""
        self._count_refused_writes = self._proofs.enabled
        workflow.set_query_handler(STATUS_QUERY, _resolved(self._status_query))
        self._decisions: dict[str, tuple[Any, Any]] = {
            command: (self._decision_handler(command), self._decision_validator(command))
            for command in ("approve", "reject", "redrive")
        }
        self._decisions["reconcile"] = (self._reconcile, self._validate_reconcile)
        self._decisions["cancel"] = (self._cancel, self._validate_cancel)
        assert tuple(self._decisions) == DECISION_UPDATES
        for command, (handler, validator) in self._decisions.items():
            workflow.set_update_handler(command, _resolved(handler), validator=validator)
        workflow.set_signal_handler(LEASE_PROGRESS_SIGNAL, _resolved(self._on_progress))
        workflow.set_signal_handler(DECIDE_SIGNAL, _resolved(self._on_decide))
        if self._catalog is not None:
            self._set_state(RunState.RUNNING)

    def patched(self, patch_id: str) -> bool:
        """Whether the run has the change of patch ``patch_id``: always on a run made with
        :data:`BASELINE_PATCH` (no marker of its own), else :func:`temporalio.workflow.patched` (a run
        recorded before answers as it was recorded; a new workflow task of it records the marker)."""
        return self._baseline or workflow.patched(patch_id)

    # -- the catalog -------------------------------------------------------------------------------

    async def load_catalog(self) -> dict[str, ToolInfo]:
        """Learn the worker's tools (a local activity, recorded in history) and start running.

        A worker that does not serve a tool of the run's steps fails only this workflow task
        (:class:`ToolsNotServedHereError`, nothing recorded), for up to :data:`CATALOG_PATIENCE` after
        the run started, so that a worker of the queue that serves them takes the run up.

        Raises:
            ToolsNotServedHereError: as said, within :data:`CATALOG_PATIENCE`.
            ApplicationError: non-retryable ``UnknownTool`` when a step names a tool the worker
                does not serve after that; the workflow fails with it.
        """
        if self._catalog is None:
            self._catalog = await self._describe_tools()
        unknown = sorted({step.tool for step in self._steps.values()} - set(self._catalog))
        patient = bool(unknown) and workflow.now() - workflow.info().workflow_start_time < CATALOG_PATIENCE
        # Asked of Temporal, not of the baseline: it is asked only in a workflow task that then fails, so it is
        # never recorded, and it must be false in a replay (a workflow task that completed while the catalog
        # was on its way, to answer a query, replays it; failing there would fail every task of the run).
        if patient and workflow.patched(_CATALOG_PATIENCE_PATCH):
            # Not recorded: the workflow task fails, and the next one (on another worker of the
            # queue, perhaps) learns that worker's tools.
            raise ToolsNotServedHereError(
                f"this worker does not serve tool(s) {', '.join(unknown)} of run {self.run_id}; the run waits "
                f"up to {CATALOG_PATIENCE.total_seconds():g}s for a worker of its task queue that does"
            )
        if unknown:
            self._set_state(RunState.FAILED)
            raise ApplicationError(
                f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(sorted(self._catalog))} (the tools of "
                "the worker that started the run: every worker of a task queue must serve the same "
                "AGENTLEASE_TOOL_MODULES)",
                type=FailureType.UNKNOWN_TOOL.value,
                non_retryable=True,
            )
        self._set_state(RunState.RUNNING)
        return self._catalog

    async def _describe_tools(self) -> dict[str, ToolInfo]:
        self._learnt = True
        if self._baseline and self._proofs.wanted:  # one local activity for the catalog and the progress secret
            described = await workflow.execute_local_activity(
                DESCRIBE_RUN, start_to_close_timeout=_DESCRIBE_TIMEOUT, result_type=dict[str, Any]
            )
            self._proofs.learn(described["progress_secret"])
            catalog = described["tools"]
        else:
            catalog = await workflow.execute_local_activity(
                DESCRIBE_TOOLS, start_to_close_timeout=_DESCRIBE_TIMEOUT, result_type=list[dict[str, Any]]
            )
        return {info.name: info for info in map(ToolInfo.model_validate, catalog)}

    def register(self, info: ToolInfo) -> None:
        """Make a tool the workflow declares itself callable (a framework adapter's tool)."""
        if self._catalog is None:
            self._catalog = {}
            self._set_state(RunState.RUNNING)
        self._catalog[info.name] = info

    def known_tools(self) -> list[str] | None:
        """The tools this run may call, once known."""
        return None if self._catalog is None else sorted(self._catalog)

    # -- steps -------------------------------------------------------------------------------------

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
        self._views[step.step_id] = view
        return view

    def has_step(self, step_id: str) -> bool:
        return step_id in self._views

    def restore(self, steps: Iterable[PlanStep], carried: RunCarry) -> None:
        """Take up the steps and views of the run this one continues (continue-as-new).

        Raises:
            ValueError: the views and the steps do not name the same step ids.
        """
        by_id = {step.step_id: step for step in steps}
        if [view.step_id for view in carried.views] != list(by_id) or carried.next_step > len(by_id):
            raise ValueError("bad plan payload: carried views do not match the plan's steps")
        self._steps.update(by_id)
        self._views.update((view.step_id, view) for view in carried.views)

    def carry(self, next_step: int) -> tuple[list[PlanStep], RunCarry]:
        """The steps and views to continue as new with: the arguments of the steps before ``next_step``
        are left out (none of them runs again; decisions do not read arguments)."""
        steps = [
            step.model_copy(update={"arguments": {}}) if index < next_step else step
            for index, step in enumerate(self._steps[sid] for sid in self._views)
        ]
        return steps, RunCarry(views=list(self._views.values()), next_step=next_step)

    def unique_step_id(self, text: str) -> str:
        """A valid step id made from ``text`` that no step of this run uses yet (``-2``, ``-3``... appended)."""
        base = step_id_from(text)
        candidate, n = base, 1
        while candidate in self._views:
            n += 1
            candidate = step_id_from(f"{base}-{n}")
        return candidate

    def step_ids(self) -> list[str]:
        """Step ids in the order they were added."""
        return list(self._views)

    def view(self, step_id: str) -> TaskView:
        return self._views[step_id]

    def skip(self, step_id: str) -> None:
        """Mark a step that will never start (a later step of a failed run)."""
        self._update(step_id, status=StepEnd.SKIPPED)

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        step_id: str,
        idempotency_key: str | None = None,
        share_idempotency_key: bool = False,
    ) -> CallOutcome:
        """Run one leased tool call until its task is final, waiting for people where the policy says so.

        Args:
            tool: a tool of the catalog.
            arguments: its arguments (checked by the tool's model in the activity).
            step_id: unique within the run; with the workflow id it makes the task id and default key.
            idempotency_key: the caller's key for the action, scoped to the run (``<workflow id>:<key>``);
                default ``<workflow id>:<step id>``.
            share_idempotency_key: share ``idempotency_key`` across runs (``shared:<key>``): a call of
                another run with the same key, tool and arguments settles from this one's receipt.
                Default false.

        Returns:
            How it ended: settled (with the tool's output), or rejected, abandoned, cancelled, failed.

        Raises:
            LeasedCallError: (a ``ValueError``) ``step_id`` is already used in this run, ``tool`` is
                unknown, or the step is beyond the limits of ``docs/limits.md`` (its arguments' size or
                depth, a NaN, a NUL, the workflow id's length).
        """
        if step_id in self._views:
            raise LeasedCallError(f"step id {step_id!r} is already used in run {self.run_id}")
        if len(self.run_id) > MAX_WORKFLOW_ID_CHARS:
            raise LeasedCallError(
                f"workflow id of {len(self.run_id)} characters: leased calls take at most {MAX_WORKFLOW_ID_CHARS}"
            )
        catalog = self._catalog if self._catalog is not None else await self.load_catalog()
        if tool not in catalog and not self._learnt and self.patched(_LEARN_NAMED_TOOL_PATCH):
            catalog.update({name: info for name, info in (await self._describe_tools()).items() if name not in catalog})
        if tool not in catalog:
            raise LeasedCallError(f"unknown tool {tool!r}; known tools: {', '.join(sorted(catalog))}")
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
        self.show_search_attributes()
        return outcome

    async def run_step(self, step_id: str) -> CallOutcome:
        """Run a registered step until it is final (see :meth:`call`).

        A step whose tool declares an action key and that has no key of its own is keyed by it first
        (:meth:`_action_key`); while another step of the run runs under the same key, it waits for that
        one to end, then runs (and settles from that one's receipt when it settled).
        """
        step = self._steps[step_id]
        if self._views[step_id].status.is_terminal:
            return CallOutcome(self._views[step_id])  # cancelled before it started
        if self.cancelled:
            return CallOutcome(self._update(step_id, status=TaskStatus.CANCELLED, error="the run was cancelled"))
        assert self._catalog is not None, "load_catalog() first"
        info = self._catalog[step.tool]
        failed = self._action_key(step_id, info)
        if failed is not None:
            return CallOutcome(failed)
        step = self._steps[step_id]
        key = self._views[step_id].idempotency_key
        if key in self._keys_in_use and self.patched(ACTION_KEY_PATCH):
            while key in self._keys_in_use:  # one at a time: the next one finds the first's receipt
                await workflow.wait_condition(lambda: key not in self._keys_in_use)
        self._keys_in_use[key] = step_id
        try:
            return await self._run_step(step, info)
        finally:
            if self._keys_in_use.get(key) == step_id:
                del self._keys_in_use[key]

    def _action_key(self, step_id: str, info: ToolInfo) -> TaskView | None:
        """Key a step that has no key of its own with its tool's declared action key (scoped to the run,
        or shared when the step says so); the failed view when its arguments cannot make the key."""
        step = self._steps[step_id]
        if step.idempotency_key is not None or info.action_key is None or not self.patched(ACTION_KEY_PATCH):
            return None
        try:
            key = info.key_for(step.arguments)
            keyed = PlanStep.model_validate({**step.model_dump(), "idempotency_key": key})
        except (ValueError, ValidationError) as exc:
            why = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
            return self._update(step_id, status=StepEnd.FAILED, error=f"no action key for {step.tool}: {why}")
        self._steps[step_id] = keyed
        scoped = scoped_idempotency_key(self.run_id, key or "", shared=keyed.share_idempotency_key)
        self._update(step_id, idempotency_key=scoped)
        return None

    async def _run_step(self, step: PlanStep, info: ToolInfo) -> CallOutcome:
        step_id = step.step_id
        self._set_state(self._state, tool=step.tool, stage=None)
        if self._live and self._settled_owner:
            self._wanted[sa.CURRENT_OWNER.name] = ""  # the previous step's owner is not this one's
        if info.requires_approval:
            await self._apply(step, DecisionKind.AWAIT_APPROVAL, _RUN_DECIDER, f"{step.tool} requires approval")
            await self._wait_for_person(step_id)
            if self._views[step_id].status.is_terminal:
                return CallOutcome(self._views[step_id])
        while True:
            outcome = await self._attempt(step, info)
            status = outcome.view.status
            if status.awaits_decision:
                await self._wait_for_person(step_id)
                status = self._views[step_id].status
            if not (isinstance(status, TaskStatus) and status.claimable):
                return CallOutcome(self._views[step_id], outcome.output)

    async def _wait_for_person(self, step_id: str) -> None:
        waiting = self._views[step_id].status
        self._refresh_waiting()
        self.show_search_attributes()
        await workflow.wait_condition(lambda: self._views[step_id].status != waiting)
        self._refresh_waiting()

    async def _attempt(self, step: PlanStep, info: ToolInfo) -> CallOutcome:
        """Execute the leased activity once (Temporal retries inside)."""
        self._in_flight.add(step.step_id)
        try:
            return await self._attempt_once(step, info)
        finally:
            self._in_flight.discard(step.step_id)

    async def _attempt_once(self, step: PlanStep, info: ToolInfo) -> CallOutcome:
        sid = step.step_id
        self._update(sid, status=TaskStatus.RUNNING)
        options = leased_activity_options(info)
        call = self._tool_call(step, progress_key=await self._proofs.call_key(sid))
        handle = workflow.start_activity(
            step.tool,
            call.model_dump(mode="json", exclude={"progress_key"} if call.progress_key is None else None),
            heartbeat_timeout=options.heartbeat_timeout,
            start_to_close_timeout=options.start_to_close_timeout,
            retry_policy=options.retry_policy,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            result_type=dict,
            summary=f"{sid}: {step.tool}",
        )
        self._running[sid] = handle
        if self._baseline:
            # Shown with the attempt's first progress signal (after PROGRESS_FIRST_AFTER) or the call's end:
            # a quick call costs its run one upsert, not one at its start and another at its end.
            workflow.set_current_details(self.current_details())
        else:
            self.show_search_attributes()
        try:
            outcome = ToolOutcome.model_validate(await handle)
        except ActivityError as err:
            self._running.pop(sid, None)
            if isinstance(err.cause, CancelledError) and not self._views[sid].status.is_cancelled:
                await self._cancelled_with_the_run(step)
            return CallOutcome(self._failed(sid, err))
        finally:
            self._running.pop(sid, None)
        if self._views[sid].status.is_cancelled:
            return CallOutcome(self._views[sid])
        self._set_state(self._state, stage=outcome.stage)
        if self._live:
            self._wanted[sa.CURRENT_GENERATION.name] = outcome.claim_generation
        ended_by: dict[str, Any] = {}
        if self._settled_owner:
            ended_by = self._ended_by_attempt(outcome)
        if outcome.refused_writes is not None:
            self._learn_refused_writes(sid, outcome.refused_writes)
        view = self._update(
            sid,
            status=outcome.status,
            stage=outcome.stage,
            claim_generation=outcome.claim_generation,
            attempts=outcome.attempts,
            receipt=outcome.receipt,
            error=None,
            settled_by=outcome.settled_by,
            **ended_by,
        )
        return CallOutcome(view, outcome.result)

    def _ended_by_attempt(self, outcome: ToolOutcome) -> dict[str, Any]:
        """(:data:`SETTLED_OWNER_PATCH`) The view's owner and claim time: the generation that ended the call,
        not the last progress signal's (a paused loser's); the run's highest generation goes on."""
        self._highest_generation = max(self._highest_generation, outcome.claim_generation)
        if self._live:
            self._wanted[sa.CURRENT_GENERATION.name] = self._highest_generation
            self._wanted[sa.CURRENT_OWNER.name] = outcome.lease_owner or ""
        return {"lease_owner": outcome.lease_owner, "claimed_at": outcome.claimed_at}

    def _failed(self, step_id: str, err: ActivityError) -> TaskView:
        """The view of a step whose attempt failed: the status its failure reports."""
        if self._views[step_id].status.is_cancelled:
            return self._views[step_id]
        cause = err.cause
        if isinstance(cause, CancelledError):
            return self._update(step_id, status=TaskStatus.CANCELLED, error=cause.message)
        if not isinstance(cause, ApplicationError):
            return self._update(step_id, status=StepEnd.FAILED, error=str(err))
        facts: dict[str, Any] = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
        failure = FailureType.parse(cause.type)
        status: StepStatus = StepEnd.FAILED
        if failure is not None and failure.status is not None:
            status = failure.status
        elif failure is FailureType.TASK_CLOSED and facts.get("status") in TaskStatus.__members__.values():
            status = TaskStatus(facts["status"])
        return self._update(
            step_id,
            status=status,
            error=cause.message,
            stage=Stage(facts["stage"]) if facts.get("stage") else None,
            claim_generation=facts.get("claim_generation"),
            attempts=facts.get("attempts"),
        )

    def _tool_call(self, step: PlanStep, *, progress_key: str | None = None) -> ToolCall:
        """The leased activity's input for ``step``: its task, arguments and idempotency key (G4), and the
        key its progress signals are proven with (a scheduled call's only)."""
        view = self._views[step.step_id]
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

    def _learn_refused_writes(self, step_id: str, count: int) -> None:
        """(:data:`PROOF_PATCH`) The task's refused late writes are at least ``count`` (the ledger's
        count when it was read; reports may arrive in any order); the run's sum is ``AgentLeaseRefusedWrites``."""
        if not self._count_refused_writes or count <= self._views[step_id].refused_writes:
            return
        self._update(step_id, refused_writes=count)
        self._wanted[sa.REFUSED_WRITES.name] = sum(view.refused_writes for view in self._views.values())

    # -- state -------------------------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self._state

    def end(self, state: RunState) -> None:
        """The run ended (completed, cancelled or failed): no more calls or decisions."""
        self.closed = True
        self._set_state(state, waiting_reason="")

    def _update(self, step_id: str, **changes: Any) -> TaskView:
        view = self._views[step_id].model_copy(update=changes)
        self._views[step_id] = view
        return view

    def _refresh_waiting(self) -> None:
        """``waiting`` while any step waits for a person, with who waits for what; else ``running``."""
        if self._state.ended:
            return
        waiting = [f"{v.step_id}: {v.status.value}" for v in self._views.values() if v.status.awaits_decision]
        self._set_state(RunState.WAITING if waiting else RunState.RUNNING, waiting_reason=", ".join(waiting))

    def _set_state(
        self, state: RunState, *, waiting_reason: str | None = None, tool: str | None = None, stage: Any = ...
    ) -> None:
        """Set the run's state; its search attributes follow (see :meth:`show_search_attributes`).

        A run recorded before coalescing (no :data:`COALESCE_PATCH` marker) upserts each change at
        once, as it did then; a run that ends always upserts at once.
        """
        self._state = state
        self._wanted[sa.RUN_STATUS.name] = state.value
        if waiting_reason is not None:
            self._wanted[sa.WAITING_REASON.name] = waiting_reason
        if tool is not None:
            self._wanted[sa.CURRENT_TOOL.name] = tool
        if stage is not ...:
            self._wanted[sa.CURRENT_STAGE.name] = str(getattr(stage, "value", stage) or "")
        if not self._coalesce or state.ended:
            self.show_search_attributes()

    def show_search_attributes(self) -> None:
        """Upsert the search attributes whose value changed since they were last shown, in one command.

        The calls do this whenever they wait (for an activity, for a person), when :meth:`call`
        returns and when the run ends: the changes of one workflow task (a step's end, the next
        step's start) are shown once, with the values visibility would have ended with anyway. A
        workflow that waits on something of its own between calls may call it first.
        """
        changed = {name: value for name, value in self._wanted.items() if self._shown.get(name) != value}
        if changed:
            self._shown.update(changed)
            workflow.upsert_search_attributes([sa.BY_NAME[name].value_set(value) for name, value in changed.items()])
        workflow.set_current_details(self.current_details())

    async def _apply(self, step: PlanStep, kind: DecisionKind, by: str, reason: str, **extra: Any) -> TaskView:
        """Write a decision to the ledger (evidence: who and why), then show its result."""
        assert self._catalog is not None
        info = self._catalog[step.tool]
        view = self._views[step.step_id]
        task = TaskSpec.of(self._tool_call(step), info.side_effect_class, info.lease_ttl)
        self.show_search_attributes()
        if self._unrecorded:
            await self._flush_refusals()  # refused signals go to the trail with the run's next decision
        decided = await workflow.execute_activity(
            APPLY_DECISION,
            LedgerDecision(kind=kind, task=task, by=by, reason=reason, **extra).model_dump(mode="json"),
            start_to_close_timeout=_DECISION_TIMEOUT,
            retry_policy=_DECISION_RETRY,
            result_type=dict,
            summary=f"{step.step_id}: {kind.value} by {by}",
        )
        outcome = ToolOutcome.model_validate(decided)
        shown = TaskStatus.PENDING if outcome.status is TaskStatus.RELEASED else outcome.status
        if by != _RUN_DECIDER or kind is not DecisionKind.AWAIT_APPROVAL:
            self._last_decision = _decision_text(step.step_id, kind, by, reason, bare=self._bounded)
            if self._live:
                self._wanted[sa.LAST_DECISION.name] = self._last_decision
        # A person ended the call without a receipt: the view says who and why (the run's status,
        # and what an agent framework's model is told).
        return self._update(
            step.step_id,
            status=shown,
            stage=outcome.stage,
            claim_generation=outcome.claim_generation or view.claim_generation,
            attempts=outcome.attempts if outcome.attempts else view.attempts,
            receipt=outcome.receipt,
            error=_ended_by(outcome.status, by, redact(reason) if self._bounded else reason),
        )

    # -- the query and the decision updates --------------------------------------------------------

    def status(self) -> RunStatus:
        """The run as the ``status`` query reports it."""
        return RunStatus(
            agent_run_id=self.run_id,
            status=self._state,
            closed=self.closed,
            tasks=list(self._views.values()),
            last_decision=self._last_decision,
            refused=list(self._refused),
            refused_count=max(self._refused_count, len(self._refused)),
            refused_progress=self._proofs.refused,
        )

    def current_details(self) -> str:
        """The run's current details text (the Temporal UI shows it on the run's page), one line each:
        every running step (``publish: external_call, generation 2, renewing: uploading 3 of 5 images
        (worker-b)``), every step waiting for a person, the last decision and the last refused signal."""
        lines = []
        for view in self._views.values():
            if view.status is TaskStatus.RUNNING:
                line = f"{view.step_id}: {view.stage.value if view.stage else 'claiming'}"
                if view.claim_generation:
                    line += f", generation {view.claim_generation}"
                if view.progress and view.stage is not None:
                    line += f", renewing: {view.progress}"
                if view.lease_owner:
                    line += f" ({view.lease_owner})"
                lines.append(line)
            elif view.status.awaits_decision:
                lines.append(f"{view.step_id}: {view.status.value}, waiting for a person")
        if not lines:
            lines.append(f"run {self._state.value}")
        lines += [  # a call another generation took over: who settled it
            f"{view.step_id}: settled by generation {view.claim_generation} ({view.lease_owner})"
            for view in self._views.values()
            if view.status is TaskStatus.SETTLED and (view.claim_generation or 0) > 1 and view.lease_owner
        ]
        if self._last_decision:
            lines.append(f"last decision: {self._last_decision}")
        if self._refused:
            last = self._refused[-1]
            lines.append(f"refused {last.decision} signal by {last.by or '?'}: {last.refusal}")
        lines += refused_writes_line(self._views)
        if (dropped := self._proofs.line()) is not None:
            lines.append(dropped)
        return "\n".join(lines)

    async def _on_progress(self, payload: Any) -> None:
        """A running attempt's :class:`LeaseProgress`: show it (a late or stale one is ignored).

        The ``status`` query and the current details change at once; the search attributes once per
        workflow task (the signals of one task are upserted together), only when the stage, the
        generation or the owner changed (a renewal's reason alone is not upserted)."""
        if not self._live:
            return
        progress = self._proofs.accepted(payload, self._views)
        if progress is None:  # malformed, or (runs made with PROOF_PATCH) not proven: dropped, counted
            if self._proofs.enabled:
                workflow.set_current_details(self.current_details())
            return
        sid = progress.step_id
        if progress.refused_writes is not None:  # an attempt that lost its lease, not live progress
            if sid in self._views and self._count_refused_writes:
                self._learn_refused_writes(sid, progress.refused_writes)
                workflow.set_current_details(self.current_details())
                await workflow.wait_condition(lambda: True)  # after every signal of this workflow task
                self.show_search_attributes()
            return
        if sid not in self._running:
            return  # the attempt already ended: its outcome is the newer fact
        view = self._views[sid]
        known = view.claim_generation or 0
        if progress.claim_generation < known:
            return
        if progress.claim_generation == known and _stage_order(progress.stage) < _stage_order(view.stage):
            return  # signals of one attempt may arrive out of order
        self._update(
            sid,
            stage=progress.stage,
            claim_generation=progress.claim_generation,
            lease_owner=progress.lease_owner,
            progress=redact(progress.reason) if self._bounded else progress.reason,
        )
        self._wanted[sa.CURRENT_GENERATION.name] = progress.claim_generation
        if self._settled_owner:
            self._highest_generation = max(self._highest_generation, progress.claim_generation)
            self._wanted[sa.CURRENT_GENERATION.name] = self._highest_generation
        self._wanted[sa.CURRENT_OWNER.name] = progress.lease_owner
        self._wanted[sa.CURRENT_STAGE.name] = progress.stage.value if progress.stage else ""
        workflow.set_current_details(self.current_details())
        await workflow.wait_condition(lambda: True)  # after every signal of this workflow task
        self.show_search_attributes()

    async def _on_decide(self, payload: Any) -> None:
        """The ``decide`` signal: the decision update of the same name, or a recorded refusal."""
        if (why := undecodable(payload)) is not None:  # refused alone; the run goes on (agentlease.codec)
            await self._refuse("", {}, f"undecodable payload: {why}")
            return
        body = dict(payload) if isinstance(payload, dict) else {}
        decision = str(body.pop("decision", "") or "")[:50]
        try:
            if decision not in self._decisions:
                raise ValueError(
                    f"unknown decision {decision!r}; a decide signal carries one of {', '.join(self._decisions)}"
                )
            handler, validator = self._decisions[decision]
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
        self._refused = [*self._refused, refused][-_KEPT_REFUSALS:]
        workflow.logger.warning("refused %s signal for step %s: %s", refused.decision, step_id, refusal)
        if self._bounded:
            # Counted, and written to the trail as one summary at most once a minute (or with the run's
            # next decision): a flood of refused signals costs no activity, and no trail entry, each.
            self._refused_count += 1
            if step_id in self._steps:
                if not self._unrecorded:
                    self._unrecorded_since = workflow.now()
                self._unrecorded = [*self._unrecorded, refused][-_KEPT_REFUSALS:]
                self._unrecorded_total += 1
            if self._unrecorded and (self._last_flush is None or workflow.now() - self._last_flush >= _REFUSAL_FLUSH):
                await self._flush_refusals()
            workflow.set_current_details(self.current_details())
            return
        step = self._steps.get(step_id or "")
        if step is not None and self._catalog is not None and step.tool in self._catalog:
            info = self._catalog[step.tool]
            try:
                await self._record_refusal(step, info, refused)
            except ActivityError as exc:  # a signal handler must not fail the run: the status keeps it
                workflow.logger.warning("refused %s signal not written to the trail: %s", refused.decision, exc)
        workflow.set_current_details(self.current_details())

    async def _flush_refusals(self) -> None:
        """Write the refused signals not yet recorded as one ``decision_refused`` summary on the step the
        last one named ("N refused since ..."); past :data:`_MAX_RECORDED_REFUSALS` summaries only counted."""
        pending, total, since = self._unrecorded, self._unrecorded_total, self._unrecorded_since
        self._unrecorded, self._unrecorded_total, self._unrecorded_since = [], 0, None
        self._last_flush = workflow.now()
        if not pending or self._recorded_summaries >= _MAX_RECORDED_REFUSALS or self._catalog is None:
            return
        last = pending[-1]
        step = self._steps.get(last.step_id or "")
        if step is None or step.tool not in self._catalog:
            return
        self._recorded_summaries += 1
        when = since.isoformat(timespec="seconds") if since is not None else "?"
        text = last.refusal if total == 1 else f"{total} decide signals refused since {when}; the last: {last.refusal}"
        summary = last.model_copy(update={"refusal": text[:2000]})
        try:
            await self._record_refusal(step, self._catalog[step.tool], summary)
        except ActivityError as exc:  # a signal handler must not fail the run: the status keeps it
            workflow.logger.warning("refused signals not written to the trail: %s", exc)

    async def _record_refusal(self, step: PlanStep, info: ToolInfo, refused: RefusedDecision) -> None:
        await workflow.execute_activity(
            RECORD_REFUSAL,
            LedgerRefusal(
                task=TaskSpec.of(self._tool_call(step), info.side_effect_class, info.lease_ttl),
                decision=refused.decision,
                by=refused.by,
                refusal=refused.refusal,
            ).model_dump(mode="json"),
            start_to_close_timeout=_DECISION_TIMEOUT,
            retry_policy=_DECISION_RETRY,
            summary=f"{step.step_id}: refused {refused.decision} signal",
        )

    def _status_query(self) -> dict[str, Any]:
        return self.status().model_dump(mode="json")

    def _require(self, step_id: str, kind: DecisionKind) -> None:
        """Refuse a decision the step's status does not allow (decision table)."""
        rule = DECISIONS[kind]
        if step_id not in self._views:
            raise ValueError(f"run {self.run_id} has no step {step_id!r}")
        status = self._views[step_id].status
        if not rule.allows(status):
            allowed = " or ".join(sorted(s.value for s in rule.applies_to))
            raise ValueError(f"cannot {rule.command} step {step_id!r}: it is {status.value}, not {allowed}")

    def _decision_handler(self, command: str) -> Any:
        kind = DecisionKind(command)

        async def handler(payload: dict[str, Any]) -> dict[str, Any]:
            request = parse_payload(DecisionRequest, payload, command)
            signed = signed_decision(command, request)
            await self._apply(self._steps[request.step_id], kind, request.by, request.reason, **signed)
            self._refresh_waiting()
            self.show_search_attributes()
            return self._status_query()

        return handler

    def _decision_validator(self, command: str) -> Any:
        kind = DecisionKind(command)

        def validator(payload: dict[str, Any]) -> None:
            request = parse_payload(DecisionRequest, payload, command)
            self._require(request.step_id, kind)
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
        await self._apply(self._steps[request.step_id], kind, request.by, request.reason, **extra)
        self._refresh_waiting()
        self.show_search_attributes()
        return self._status_query()

    def _validate_reconcile(self, payload: dict[str, Any]) -> None:
        self._reconcile_kind(parse_payload(ReconcileRequest, payload, "reconcile"))

    def _reconcile_kind(self, request: ReconcileRequest) -> DecisionKind:
        """The decision a reconcile makes on its step's status, or a ``ValueError`` if none applies."""
        if request.step_id not in self._views:
            raise ValueError(f"run {self.run_id} has no step {request.step_id!r}")
        status = self._views[request.step_id].status
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
        if request.step_id is not None:
            targets = [request.step_id]
            await self._cancel_calls(targets, request, signed)
        elif self.patched(_CANCEL_VERIFIED_FIRST):
            targets = await self._cancel_run(request, signed)
        else:  # runs recorded before: the run marked cancelled before its first call's check
            self.cancelled = True
            targets = [sid for sid, view in self._views.items() if not view.status.is_terminal]
            try:
                await self._cancel_calls(targets[:1], request, signed)
            except ActivityError:
                self.cancelled = False  # refused (an unsigned or badly signed cancel): the run goes on
                raise
            await self._cancel_calls(targets[1:], request, signed)
        if self.patched(_CANCEL_ANSWERS_AT_ONCE):
            # Answer at once with the run as it is now: the cancel is in the ledger, and a running attempt
            # stops at its next renewal (refused), however long its lease; waiting for it to acknowledge
            # could outlast the caller's time limit.
            if request.step_id is None:
                self.end(RunState.CANCELLED)
        else:  # runs cancelled by an earlier version waited for the activities to acknowledge
            await workflow.wait_condition(lambda: not any(step_id in self._running for step_id in targets))
        self._refresh_waiting()
        self.show_search_attributes()
        return self._status_query()

    async def _cancel_calls(self, targets: list[str], request: CancelRequest, signed: dict[str, Any]) -> None:
        """Cancel each of ``targets`` in the ledger (which ends the claim first, so the old generation
        cannot settle: G8), then its running activity."""
        for step_id in targets:
            await self._apply(self._steps[step_id], DecisionKind.CANCEL, request.by, request.reason, **signed)
            handle = self._running.get(step_id)
            if handle is not None:
                handle.cancel()

    async def _cancel_run(self, request: CancelRequest, signed: dict[str, Any]) -> list[str]:
        """Cancel the whole run: its first open call, where the ledger's decision activity checks the
        cancel's signature; only then the run (no call starts any more) and every other open call,
        those that started meanwhile included. Returns the calls it cancelled.

        Raises:
            ApplicationError: no call is open: nothing would check the cancel (the update is refused).
            ActivityError: the first call's cancel was refused (unsigned, badly signed, replayed): the
                run goes on as it was.
        """
        done: list[str] = []
        while targets := [sid for sid, view in self._views.items() if not view.status.is_terminal and sid not in done]:
            await self._cancel_calls(targets[:1], request, signed)
            self.cancelled = True
            done.append(targets[0])
        if not done:
            raise ApplicationError(_NOTHING_TO_CANCEL.format(run=self.run_id), type=FailureType.DECISION_REFUSED)
        return done

    async def stop_calls(self, reason: str = "its workflow was cancelled") -> None:
        """Stop the run's leased calls because its workflow (or its agent run) was cancelled: what
        ``agentlease cancel RUN`` does, from workflow code, before the cancellation is let through.

        Every task that is not final is cancelled in the ledger first (the claim ends there, G8: an
        ``unsafe`` call that may have sent becomes ``cancelled_effect_unknown``, listed by ``agentlease
        waiting``), then each running activity is cancelled, and this waits until each has stopped.
        An agent framework's runner may drop a tool call's task when it is cancelled; this is what
        keeps the run from ending while the call goes on. The adapters' ``run_agent`` call it; a
        workflow of its own calls it where it catches ``asyncio.CancelledError``.

        Args:
            reason: recorded with each cancel (the decider is ``agentlease``).
        """
        if not self.patched(CANCEL_IN_LEDGER_PATCH):
            return
        self.cancelled = True
        targets = [sid for sid, view in self._views.items() if not view.status.is_terminal and sid in self._steps]
        for sid in targets:
            if sid not in self._cancelling and not self._views[sid].status.is_terminal:
                await self._cancel_in_ledger(self._steps[sid], reason)
            handle = self._running.get(sid)
            if handle is not None:
                handle.cancel()
        await workflow.wait_condition(lambda: not self._in_flight)
        self._refresh_waiting()

    async def _cancelled_with_the_run(self, step: PlanStep) -> None:
        """The call's activity was cancelled with its workflow or agent run, not by an operator (whose
        cancel the ledger holds first): cancel its task in the ledger too (see :meth:`stop_calls`)."""
        sid = step.step_id
        if sid in self._cancelling:
            await workflow.wait_condition(lambda: sid not in self._cancelling)
            return
        if self.patched(CANCEL_IN_LEDGER_PATCH):
            await self._cancel_in_ledger(step, "its workflow (or agent run) was cancelled while it ran")

    async def _cancel_in_ledger(self, step: PlanStep, reason: str) -> None:
        """The run's own cancel of one task (unsigned: it answers Temporal's cancellation of the run)."""
        sid = step.step_id
        self._cancelling.add(sid)
        try:
            await self._apply(step, DecisionKind.CANCEL, _RUN_DECIDER, reason, run_own=True)
        except ActivityError as exc:  # the task got further first (it settled): the ledger's word stands
            workflow.logger.info("cancel of step %s with its run not applied: %s", sid, exc.cause or exc)
        finally:
            self._cancelling.discard(sid)

    def _validate_cancel(self, payload: dict[str, Any]) -> None:
        request = parse_payload(CancelRequest, payload, "cancel")
        if self._state.ended:
            raise ValueError(f"run {self.run_id} has ended ({self._state.value}); there is nothing to cancel")
        if request.step_id is not None:
            self._require(request.step_id, DecisionKind.CANCEL)
        elif all(view.status.is_terminal for view in self._views.values()):
            raise ValueError(_NOTHING_TO_CANCEL.format(run=self.run_id))


def _stage_order(stage: Stage | None) -> int:
    return -1 if stage is None else stage.order


def _decision_text(step_id: str, kind: DecisionKind, by: str, reason: str, *, bare: bool = False) -> str:
    """``publish: approved`` (``bare``: search attributes carry no free text; who and why are in the
    evidence trail), or, in runs recorded before, ``publish: approved by alice: ticket OPS-12`` (at most
    250 characters)."""
    rule = DECISIONS[kind]
    verb = rule.event.value if rule.action is None else f"{rule.event.value} ({rule.action})"
    if bare:
        return f"{step_id}: {verb}"[:_MAX_DECISION_CHARS]
    text = f"{step_id}: {verb} by {by}: {reason}"
    return text if len(text) <= _MAX_DECISION_CHARS else text[: _MAX_DECISION_CHARS - 3] + "..."


def _ended_by(status: TaskStatus, by: str, reason: str) -> str | None:
    """A decision that ended a task without settling it, as its view's ``error``: who and why
    (``"rejected by alice: wrong recipient"``); ``None`` for any other decision."""
    if status.is_terminal and status is not TaskStatus.SETTLED:
        return f"{status.value} by {by}: {reason}"
    return None


_INSTANCE_ATTRIBUTE = "__agentlease_calls__"


def leased_calls(catalog: Iterable[ToolInfo] | None = None) -> LeasedToolCalls:
    """The running workflow's :class:`LeasedToolCalls`, made (and its handlers installed) on first use.

    Call it from workflow code. Call it early for the ``status`` query and the decision updates to
    answer before the first tool call: in ``@workflow.init``, where the workflow object does not
    exist yet, keep the result in an attribute (``self.calls = leased_calls()``); later calls find it
    there. (State lives on the workflow object only: a run replayed in the same process, after a
    cache eviction, builds its own.)

    Args:
        catalog: tools to make callable (adapters pass their tools' infos); more can be added later.
    """
    instance = workflow.instance()
    calls = _attached(instance)
    if calls is None:
        calls = LeasedToolCalls(catalog)
        catalog = None
        if instance is not None:
            setattr(instance, _INSTANCE_ATTRIBUTE, calls)
    for info in catalog or ():
        calls.register(info)
    return calls


def _attached(instance: object | None) -> LeasedToolCalls | None:
    """The :class:`LeasedToolCalls` the workflow object holds (made by ``leased_calls`` or kept by its ``__init__``)."""
    if instance is None:
        return None
    found = getattr(instance, _INSTANCE_ATTRIBUTE, None)
    if isinstance(found, LeasedToolCalls):
        return found
    return next((v for v in getattr(instance, "__dict__", {}).values() if isinstance(v, LeasedToolCalls)), None)


class LeasedCallsInterceptor(Interceptor):
    """Installs the ``status`` query and the decision updates on every workflow of the worker from its
    start, so that a workflow making leased calls needs no set-up line (``AgentLeasePlugin`` adds it).

    Until the run's first leased call (:func:`leased_calls`, which installs the real handlers in
    their place) the query answers the run ``starting`` with no task, and the updates refuse (no step
    to decide on; a refused update leaves no history). A workflow that defines any of these handlers
    itself, or a dynamic query or update handler, is left alone. Nothing here issues a command, so
    histories recorded without it replay with it.
    """

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _LeasedCallsInbound


class _LeasedCallsInbound(WorkflowInboundInterceptor):
    def init(self, outbound: Any) -> None:
        super().init(outbound)
        if _defines_own_handlers():
            return
        workflow.set_query_handler(STATUS_QUERY, _resolved(_status_before_calls))
        for command in DECISION_UPDATES:
            workflow.set_update_handler(
                command, _resolved(_refused_before_calls(command)), validator=_no_step_yet(command)
            )

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        """Run the workflow; when it returns or raises, end its leased calls' state if nothing did."""
        try:
            result = await super().execute_workflow(input)
        except workflow.ContinueAsNewError:
            raise
        except (asyncio.CancelledError, CancelledError):
            calls = _attached(workflow.instance())
            if calls is not None and not calls.state.ended:
                await calls.stop_calls()  # its calls stop (cancelled in the ledger first) before the run ends
            _end_attached(RunState.CANCELLED)
            raise
        except Exception:  # not GeneratorExit nor an eviction: the run did not end, its coroutine was closed
            _end_attached(RunState.FAILED)
            raise
        _end_attached(RunState.COMPLETED)
        return result


def _end_attached(state: RunState) -> None:
    calls = _attached(workflow.instance())
    if calls is None or calls.state.ended or not calls.patched(_END_ON_RETURN_PATCH):
        return
    calls.end(RunState.CANCELLED if state is RunState.COMPLETED and calls.cancelled else state)


_HINTS: dict[CodeType, tuple[inspect.Signature, dict[str, Any]]] = {}
"""Resolved signatures and type hints of handler functions, by their code (see :func:`_resolved`)."""


def _resolved(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` (a function or a bound method) with its signature and type hints resolved once per process.

    Temporal reads both each time a run sets a handler, to decode its arguments, and this module's annotations
    are strings (evaluated anew each time): every run sets up to 14 handlers. The values are the ones Temporal
    would compute; a closure made again by each run shares its code, hence its entry.
    """
    function: Any = getattr(handler, "__func__", handler)
    known = _HINTS.get(function.__code__)
    if known is None:
        known = (inspect.signature(function, eval_str=True), typing.get_type_hints(function))
        _HINTS[function.__code__] = known
    function.__signature__, function.__annotations__ = known
    return handler


def _defines_own_handlers() -> bool:
    return (
        workflow.get_query_handler(STATUS_QUERY) is not None
        or any(workflow.get_update_handler(command) is not None for command in DECISION_UPDATES)
        or any(workflow.get_signal_handler(name) is not None for name in (DECIDE_SIGNAL, LEASE_PROGRESS_SIGNAL))
        or workflow.get_dynamic_query_handler() is not None
        or workflow.get_dynamic_update_handler() is not None
    )


def _status_before_calls() -> dict[str, Any]:
    calls = _attached(workflow.instance())
    if calls is not None:
        return calls.status().model_dump(mode="json")
    status = RunStatus(agent_run_id=workflow.info().workflow_id, status=RunState.STARTING, closed=False, tasks=[])
    return status.model_dump(mode="json")


def _no_step_yet(command: str) -> Any:
    def validator(payload: Any) -> None:
        raise ValueError(
            f"cannot {command}: run {workflow.info().workflow_id} has made no leased call yet, so it has no step to "
            "decide on"
        )

    return validator


def _refused_before_calls(command: str) -> Any:
    async def handler(payload: Any) -> dict[str, Any]:
        _no_step_yet(command)(payload)
        raise AssertionError("unreachable: the validator refuses")  # pragma: no cover

    return handler
