"""Operator decisions sent to a run: ``approve``, ``reject``, ``redrive``, ``reconcile``, ``cancel`` (one task,
or every task a filter selects; ``docs/decisions.md``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from agentlease.cli.options import DECISION, setting_flags
from agentlease.cli.runs import show_run
from agentlease.cli.session import err, in_ledger, out
from agentlease.cli.session import ledger as _ledger
from agentlease.cli.session import settings as _settings
from agentlease.errors import AgentLeaseError, ConfigurationError, describe_validation_error
from agentlease.settings import AgentLeaseSettings

if TYPE_CHECKING:
    from agentlease.records import RunStatus

_Why = Annotated[str, typer.Option("--reason", help="Why (kept in the evidence trail).")]
_Run = Annotated[str, typer.Argument(help="The agent run (workflow) id.")]
_StepArg = Annotated[str, typer.Argument(help="The step id.")]
_Json = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _decide(settings: AgentLeaseSettings, agent_run_id: str, update: str, payload: Any, as_json: bool) -> RunStatus:
    from agentlease.cli.render import decided_title

    sending = (
        _approve_in_step(settings, agent_run_id, payload)
        if update == "approve"
        else send_decision(settings, agent_run_id, update, payload)
    )
    status = asyncio.run(sending)
    show_run(status, as_json, title=decided_title(status, update, getattr(payload, "step_id", None)))
    return status


async def send_decision(
    settings: AgentLeaseSettings,
    agent_run_id: str,
    update: str,
    payload: Any,
    client: Any = None,
    *,
    generation: int | None = None,
) -> RunStatus:
    """Send a decision update to a run and wait for its answer, each step within the decision timeout; with
    ``AGENTLEASE_OPERATOR_KEY`` signed for ``generation`` (default the ledger's now; a run's cancel: none).

    Raises:
        ConfigurationError: the run refused it (its validator); AgentLeaseError: no answer in time.
    """
    from temporalio.client import (
        WorkflowUpdateFailedError,
        WorkflowUpdateRPCTimeoutOrCancelledError,
        WorkflowUpdateStage,
    )
    from temporalio.service import RPCError

    from agentlease.records import RunStatus
    from agentlease.runtime.temporal import connect

    limit = settings.decision_timeout.total_seconds()

    async def _within_limit(step: Awaitable[Any], late: str) -> Any:
        try:
            return await asyncio.wait_for(step, timeout=limit)
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            raise AgentLeaseError(late) from None
        except WorkflowUpdateFailedError as exc:
            cause: Any = exc.cause
            while getattr(cause, "cause", None) is not None:  # a refusal by the decision activity
                cause = cause.cause
            message = getattr(cause, "message", None) or str(cause)
            raise ConfigurationError(f"{update} refused: {message}") from None
        except RPCError as exc:
            raise AgentLeaseError(f"agent run {agent_run_id}: {exc.message}") from None

    if settings.operator_key is not None:
        from agentlease.security.decision_auth import OperatorKey

        key = OperatorKey(settings.operator_key)
        step_id = getattr(payload, "step_id", None)
        if generation is None and step_id is not None:
            generation = await seen_generation(settings, agent_run_id, step_id)
        proof = key.sign(agent_run_id, update, payload.model_dump(mode="json"), generation=generation)
        payload = payload.model_copy(update={"proof": proof})

    client = client or await connect(settings)
    handle = client.get_workflow_handle(agent_run_id)
    accepted = await _within_limit(
        handle.start_update(update, payload, wait_for_stage=WorkflowUpdateStage.ACCEPTED, result_type=RunStatus),
        # Temporal keeps the admitted update: it may still apply when a worker picks the run up.
        f"{update}: no worker took the decision for agent run {agent_run_id} within {limit:g}s; is a worker "
        "running for its task queue? The request may still be applied when one starts",
    )
    return await _within_limit(
        accepted.result(),
        f"{update}: accepted by agent run {agent_run_id} but not finished within {limit:g}s; "
        f"follow it with `agentlease status {agent_run_id}`",
    )


async def seen_generation(settings: AgentLeaseSettings, agent_run_id: str, step_id: str) -> int | None:
    """The claim generation of the run's step in the ledger (``None``: no such task yet), for a signed decision.
    LedgerUnavailableError: the ledger cannot be read."""
    from agentlease.errors import LedgerUnavailableError, TaskNotFoundError
    from agentlease.records import task_id_for

    try:
        async with _ledger(settings) as ledger:
            try:
                return (await ledger.get_task(task_id_for(agent_run_id, step_id))).claim_generation
            except TaskNotFoundError:
                return None
    except LedgerUnavailableError as exc:
        raise LedgerUnavailableError(
            f"a signed decision names the step's generation, read from the ledger: {exc}"
        ) from None


def _step_decision(update: str, summary: str) -> Callable[..., None]:
    """The command ``agentlease <update> RUN_ID STEP_ID --by --reason``: a decision on one step."""

    def command(
        ctx: typer.Context, agent_run_id: _Run, step_id: _StepArg, reason: _Why, as_json: _Json = False
    ) -> None:
        from agentlease.decisions.table import DecisionRequest

        settings = _settings(ctx)
        payload = _request(DecisionRequest, settings, step_id=step_id, reason=reason)
        _decide(settings, agent_run_id, update, payload, as_json)

    command.__doc__ = summary
    return setting_flags(*DECISION)(command)


reject = _step_decision("reject", "Reject a tool call that waits for approval: it never runs.")

_Sha = Annotated[
    str | None,
    typer.Option(
        "--arguments-sha256",
        help="The arguments' fingerprint that `waiting` or `status` showed: refused if the call's are other.",
    ),
]

CATCH_UP_INTERVAL_S = 0.2
"""How often ``approve`` looks again while the run catches up with the ledger. Default 0.2s."""


@setting_flags(*DECISION)
def approve(
    ctx: typer.Context,
    agent_run_id: _Run,
    step_id: _StepArg,
    reason: _Why,
    arguments_sha256: _Sha = None,
    as_json: _Json = False,
) -> None:
    """Approve a tool call that waits for approval (every unsafe tool does, by default).

    With --arguments-sha256 the approval is of the arguments you saw: refused when the call's differ.
    """
    from agentlease.decisions.table import DecisionRequest

    settings = _settings(ctx)
    payload = _request(DecisionRequest, settings, step_id=step_id, reason=reason, arguments_sha256=arguments_sha256)
    _decide(settings, agent_run_id, "approve", payload, as_json)


async def _approve_in_step(settings: AgentLeaseSettings, agent_run_id: str, payload: Any) -> RunStatus:
    """Send ``approve``; when the run refuses it while the ledger has the step ``awaiting_approval`` (a claim
    that refused an expired approval moves the ledger first, and the run learns it a moment later), send it
    once more as soon as the run shows the step awaiting approval too."""
    try:
        return await send_decision(settings, agent_run_id, "approve", payload)
    except ConfigurationError:
        if not await _run_caught_up(settings, agent_run_id, payload.step_id):
            raise
    return await send_decision(settings, agent_run_id, "approve", payload)


async def _run_caught_up(settings: AgentLeaseSettings, agent_run_id: str, step_id: str) -> bool:
    """Whether the ledger has the step ``awaiting_approval`` and the run shows it too, within the decision
    timeout."""
    from agentlease.cli.runs import run_status
    from agentlease.enums import TaskStatus
    from agentlease.errors import TaskNotFoundError
    from agentlease.records import task_id_for

    async with _ledger(settings) as ledger:
        try:
            if (await ledger.get_task(task_id_for(agent_run_id, step_id))).status is not TaskStatus.AWAITING_APPROVAL:
                return False
        except TaskNotFoundError:
            return False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.decision_timeout.total_seconds()
    while loop.time() < deadline:
        run = await run_status(settings, agent_run_id)
        if any(t.step_id == step_id and t.status == TaskStatus.AWAITING_APPROVAL for t in run.tasks):
            return True
        await asyncio.sleep(CATCH_UP_INTERVAL_S)
    return False


_RunFilter = Annotated[str | None, typer.Option("--run", help="Bulk: tasks of this agent run.")]
_StatusFilter = Annotated[
    list[str] | None, typer.Option("--status", help="Bulk: tasks in this status (repeat, or comma-separate).")
]
_ToolFilter = Annotated[str | None, typer.Option("--tool", help="Bulk: tasks of this tool.")]
_Yes = Annotated[bool, typer.Option("--yes", help="Bulk: decide every matching task without asking.")]


@dataclass(frozen=True)
class _Filters:
    """``--run/--status/--tool/--yes`` of a bulk ``redrive`` or ``cancel``."""

    run: str | None
    status: list[str] | None
    tool: str | None
    yes: bool


def _by_filter(
    settings: AgentLeaseSettings,
    kind: Any,
    model: Any,
    agent_run_id: str | None,
    filters: _Filters,
    reason: str,
    as_json: bool,
) -> bool:
    """Without a RUN_ID, decide every task the filters select (listed, confirmed, decided each) and return true."""
    from agentlease.cli.bulk import confirm_bulk, decide_each, select_tasks
    from agentlease.cli.listings import parse_statuses
    from agentlease.runtime.temporal import connect

    filtered = bool(filters.run or filters.status or filters.tool)
    if agent_run_id is not None:
        if filtered:
            raise ConfigurationError("name RUN_ID [STEP_ID], or filter with --run, --status or --tool, not both")
        return False
    if not filtered:
        raise ConfigurationError("name RUN_ID [STEP_ID], or filter with --run, --status or --tool")

    chosen = in_ledger(
        settings, lambda ledger: select_tasks(ledger, kind, filters.run, parse_statuses(filters.status), filters.tool)
    )
    confirm_bulk(chosen, kind, yes=filters.yes, out=out, err=err)

    async def _each() -> int:
        client = await connect(settings)

        async def send(task: Any) -> RunStatus:
            request = _request(model, settings, step_id=task.step_id, reason=reason)
            return await send_decision(
                settings, task.agent_run_id, kind.value, request, client, generation=task.claim_generation
            )

        return await decide_each(chosen, send, kind=kind, as_json=as_json, out=out, err=err)

    if failed := asyncio.run(_each()):
        raise AgentLeaseError(f"{kind.value}: {failed} of {len(chosen)} tasks refused or not decided (see above)")
    return True


@setting_flags(*DECISION)
def redrive(
    ctx: typer.Context,
    agent_run_id: Annotated[str | None, typer.Argument(help="The agent run; omit to redrive by filter.")] = None,
    step_id: Annotated[str | None, typer.Argument(help="The step id.")] = None,
    *,
    reason: _Why,
    run_filter: _RunFilter = None,
    status: _StatusFilter = None,
    tool: _ToolFilter = None,
    yes: _Yes = False,
    as_json: _Json = False,
) -> None:
    """Send a dead-lettered or blocked task back to work (its attempt budget restarts).

    With --run/--status/--tool instead of RUN_ID STEP_ID: every matching task, after a confirmation
    (--yes skips it).
    """
    from agentlease.decisions.table import DecisionRequest
    from agentlease.enums import DecisionKind

    settings = _settings(ctx)
    filters = _Filters(run_filter, status, tool, yes)
    if _by_filter(settings, DecisionKind.REDRIVE, DecisionRequest, agent_run_id, filters, reason, as_json):
        return
    if agent_run_id is None or step_id is None:
        raise ConfigurationError("name RUN_ID STEP_ID, or filter with --run, --status or --tool")
    _decide(
        settings, agent_run_id, "redrive", _request(DecisionRequest, settings, step_id=step_id, reason=reason), as_json
    )


@setting_flags(*DECISION)
def reconcile(
    ctx: typer.Context,
    agent_run_id: _Run,
    step_id: _StepArg,
    action: Annotated[str, typer.Option(help="confirm | retry | abandon")],
    reason: _Why,
    external_id: Annotated[str | None, typer.Option(help="With confirm: the external system's id.")] = None,
    observed: Annotated[str | None, typer.Option(help="With confirm: what you saw, as a JSON object.")] = None,
    as_json: _Json = False,
) -> None:
    """Decide a task whose side effect is ambiguous: confirm it happened, retry with the same key, or abandon."""
    from agentlease.cli.reaching import reconciled_in_ledger
    from agentlease.cli.render import tasks_table, to_json
    from agentlease.decisions.table import ReconcileRequest
    from agentlease.limits import MAX_DEPTH, loads

    try:
        seen = {} if observed is None else loads(observed, "--observed", max_depth=MAX_DEPTH + 1)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    settings = _settings(ctx)
    payload = _request(
        ReconcileRequest,
        settings,
        step_id=step_id,
        reason=reason,
        action=action,
        external_id=external_id,
        observed=seen,
    )

    record = in_ledger(settings, lambda ledger: reconciled_in_ledger(ledger, settings, agent_run_id, payload))
    if record is None:
        _decide(settings, agent_run_id, "reconcile", payload, as_json)
    elif as_json:
        out.print_json(to_json(record))
    else:
        out.print(tasks_table([record], title=f"{record.task_id}: {payload.action} recorded; it stays cancelled"))


@setting_flags(*DECISION)
def cancel(
    ctx: typer.Context,
    agent_run_id: Annotated[
        str | None, typer.Argument(help="The agent run (workflow) id; omit to cancel by filter.")
    ] = None,
    step_id: Annotated[str | None, typer.Argument(help="The step id; omit to cancel the whole run.")] = None,
    *,
    reason: _Why,
    as_json: _Json = False,
    run_filter: _RunFilter = None,
    status: _StatusFilter = None,
    tool: _ToolFilter = None,
    yes: _Yes = False,
) -> None:
    """Cancel one task or the whole run; cancelled stays cancelled.

    With --run/--status/--tool instead of RUN_ID: every matching task that can be cancelled, after a
    confirmation (--yes skips it).
    """
    from agentlease.decisions.table import CancelRequest
    from agentlease.enums import DecisionKind, TaskStatus

    settings = _settings(ctx)
    filters = _Filters(run_filter, status, tool, yes)
    if _by_filter(settings, DecisionKind.CANCEL, CancelRequest, agent_run_id, filters, reason, as_json):
        return
    assert agent_run_id is not None
    run = _decide(
        settings, agent_run_id, "cancel", _request(CancelRequest, settings, step_id=step_id, reason=reason), as_json
    )
    err.print(
        "the cancel is recorded in the ledger; an attempt still running stops at its next renewal, which the "
        "ledger refuses (cancelled stays cancelled)"
    )
    unknown = [t.step_id for t in run.tasks if t.status == TaskStatus.CANCELLED_EFFECT_UNKNOWN.value]
    if unknown and (step_id is None or step_id in unknown):
        from agentlease.decisions.table import command_line

        reconcile = command_line("reconcile", agent_run_id, "STEP", " --action 'confirm|abandon'")
        err.print(
            f"its effect may have happened ({', '.join(unknown)}: the call may have reached the downstream); "
            f"record what happened: {reconcile}"
        )


def _request(model: Any, settings: AgentLeaseSettings, **fields: Any) -> Any:
    """The decision payload by ``--by``; with ``AGENTLEASE_OPERATOR_KEY`` its operator is the key's (``--by``
    may only repeat it), and :func:`send_decision` signs it."""
    by = settings.operator
    if settings.operator_key is not None:
        from agentlease.security.decision_auth import OperatorKey

        operator = OperatorKey(settings.operator_key).operator
        if by not in (None, operator):
            raise ConfigurationError(
                f"--by {by}: this decision is signed with the key of {operator!r} "
                "(AGENTLEASE_OPERATOR_KEY); the operator is the key's"
            )
        by = operator
    elif by is None:
        raise ConfigurationError("--by is required (who decides), unless AGENTLEASE_OPERATOR_KEY signs the decision")
    try:
        return model(**fields, by=by)
    except ValidationError as exc:
        raise ConfigurationError(f"bad decision: {describe_validation_error(exc)}") from None
