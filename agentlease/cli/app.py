"""The ``agentlease`` command line (typer + rich).

Every global flag maps to an ``AGENTLEASE_*`` variable shown by ``--help``. Errors are one line on
stderr with a non-zero exit: 1 for a failed operation, 2 for bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

# Temporal's client is imported by the commands that reach Temporal: a ledger-only command (tasks,
# events, waiting, runs) starts without it.
from agentlease.cli.render import run_table, tasks_table, to_json
from agentlease.enums import RunState
from agentlease.errors import (
    AgentLeaseError,
    ConfigurationError,
    LedgerUnavailableError,
    describe_validation_error,
    one_line,
)
from agentlease.names import STATUS_QUERY
from agentlease.records import RunStatus
from agentlease.settings import AgentLeaseSettings, with_overrides

app = typer.Typer(
    name="agentlease",
    help="Leased agent tool calls on Temporal: fencing tokens, idempotency keys, settlement receipts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The ledger database.", no_args_is_help=True)
app.add_typer(db_app, name="db")

out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)

_RPC = timedelta(seconds=5)
"""Deadline of one query to a run."""

EXAMPLE_PLANS = Path(__file__).resolve().parents[1] / "demo" / "plans"


_SECURE = "Transport, payloads and signed decisions"


@app.callback()
def _global(
    ctx: typer.Context,
    temporal_address: Annotated[
        str | None, typer.Option(envvar="AGENTLEASE_TEMPORAL_ADDRESS", help="Temporal frontend host:port.")
    ] = None,
    namespace: Annotated[str | None, typer.Option(envvar="AGENTLEASE_NAMESPACE", help="Temporal namespace.")] = None,
    task_queue: Annotated[str | None, typer.Option(envvar="AGENTLEASE_TASK_QUEUE", help="Task queue.")] = None,
    ledger_url: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_LEDGER_URL", help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB."),
    ] = None,
    tool_modules: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_TOOL_MODULES", help="Comma-separated modules whose tools are served."),
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(envvar="AGENTLEASE_DATA_DIR", help="Files of demo and dev.")] = None,
    decision_timeout: Annotated[
        float | None,
        typer.Option(
            envvar="AGENTLEASE_DECISION_TIMEOUT",
            help="Seconds approve/reject/reconcile/redrive/cancel/status wait for a worker. Default 30.",
        ),
    ] = None,
    temporal_tls: Annotated[
        bool | None,
        typer.Option(
            "--tls",
            rich_help_panel=_SECURE,
            envvar="AGENTLEASE_TEMPORAL_TLS",
            help="TLS to Temporal with the system's CAs.",
        ),
    ] = None,
    temporal_tls_ca_file: Annotated[
        Path | None,
        typer.Option(
            "--tls-ca",
            rich_help_panel=_SECURE,
            envvar="AGENTLEASE_TEMPORAL_TLS_CA_FILE",
            help="CA of Temporal's server (PEM).",
        ),
    ] = None,
    temporal_tls_cert_file: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            rich_help_panel=_SECURE,
            envvar="AGENTLEASE_TEMPORAL_TLS_CERT_FILE",
            help="Client certificate, mTLS (PEM).",
        ),
    ] = None,
    temporal_tls_key_file: Annotated[
        Path | None,
        typer.Option(
            "--tls-key",
            rich_help_panel=_SECURE,
            envvar="AGENTLEASE_TEMPORAL_TLS_KEY_FILE",
            help="Client private key, mTLS (PEM).",
        ),
    ] = None,
    temporal_tls_server_name: Annotated[
        str | None,
        typer.Option(
            "--tls-server-name",
            rich_help_panel=_SECURE,
            envvar="AGENTLEASE_TEMPORAL_TLS_SERVER_NAME",
            help="Server name TLS checks.",
        ),
    ] = None,
    temporal_api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            rich_help_panel=_SECURE,
            envvar="AGENTLEASE_TEMPORAL_API_KEY",
            help="API key for Temporal (turns TLS on).",
        ),
    ] = None,
    codec_keys: Annotated[
        str | None,
        typer.Option(
            rich_help_panel=_SECURE,
            envvar="AGENTLEASE_CODEC_KEYS",
            help="ID:BASE64KEY,... AES-GCM payload keys; the first encrypts.",
        ),
    ] = None,
    payload_codec: Annotated[
        str | None,
        typer.Option(
            rich_help_panel=_SECURE, envvar="AGENTLEASE_PAYLOAD_CODEC", help="module:attribute of a payload codec."
        ),
    ] = None,
    operator_key: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=_SECURE,
            envvar="AGENTLEASE_OPERATOR_KEY",
            help="The operator's private key file: decisions are signed.",
        ),
    ] = None,
) -> None:
    overrides: dict[str, Any] = {
        "temporal_tls": temporal_tls,
        "temporal_tls_ca_file": temporal_tls_ca_file,
        "temporal_tls_cert_file": temporal_tls_cert_file,
        "temporal_tls_key_file": temporal_tls_key_file,
        "temporal_tls_server_name": temporal_tls_server_name,
        "temporal_api_key": temporal_api_key,
        "codec_keys": codec_keys,
        "payload_codec": payload_codec,
        "operator_key": operator_key,
        "decision_timeout": decision_timeout,
        "temporal_address": temporal_address,
        "namespace": namespace,
        "task_queue": task_queue,
        "ledger_url": ledger_url,
        "tool_modules": tool_modules,
        "data_dir": data_dir,
    }
    try:
        ctx.obj = AgentLeaseSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigurationError(f"bad setting: {describe_validation_error(exc)}") from None


def _settings(ctx: typer.Context) -> AgentLeaseSettings:
    return ctx.obj


def _log_in_one_line() -> None:
    """Log lines on stderr as ``<time> <level> <logger>: <message>``: the SDK's warnings, and agentlease's own
    one-line reports (a lost lease, a ledger outage, a clock behind the ledger) from INFO up."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentlease").setLevel(logging.INFO)


def _with(settings: AgentLeaseSettings, overrides: dict[str, Any]) -> AgentLeaseSettings:
    """``settings`` with a command's own options (``None``: not given), validated like the rest."""
    return with_overrides(settings, overrides)


@asynccontextmanager
async def _ledger(settings: AgentLeaseSettings, *, must_exist: bool = True) -> AsyncIterator[Any]:
    """The configured ledger; a read on a SQLite file that does not exist is an error, not a new file."""
    from agentlease.databases import display_url, is_missing_schema, sqlite_path
    from agentlease.ledger.store import Ledger

    path = sqlite_path(settings.ledger_url, name="ledger")
    try:
        missing = must_exist and path is not None and not path.exists()
    except OSError as exc:  # a directory on the way that this user may not read
        raise LedgerUnavailableError(f"cannot read the ledger at {path}: {exc.strerror or exc}") from None
    if missing:
        raise LedgerUnavailableError(
            f"no ledger at {path}: set AGENTLEASE_LEDGER_URL (or --ledger-url), "
            "or create it with `agentlease db upgrade`"
        )
    ledger = Ledger.from_url(settings.ledger_url, pool_size=settings.ledger_pool_size)
    try:
        yield ledger
    except (SQLAlchemyError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            raise  # the output's reader went away: not the ledger's failure
        if is_missing_schema(exc):
            cause = "the ledger has no schema yet; run `agentlease db upgrade`"
        else:
            cause = one_line(getattr(exc, "orig", None) or exc)
        raise LedgerUnavailableError(f"ledger {display_url(settings.ledger_url)}: {cause}") from None
    finally:
        await ledger.close()


@app.command()
def worker(
    ctx: typer.Context,
    sticky_schedule_to_start: Annotated[
        float | None,
        typer.Option(
            envvar="AGENTLEASE_STICKY_SCHEDULE_TO_START",
            help="Seconds a run's next workflow task waits for the worker that ran its last one before any "
            "worker takes it (after that worker died or paused). Default 3.",
        ),
    ] = None,
    activity_pollers: Annotated[
        int | None,
        typer.Option(
            envvar="AGENTLEASE_ACTIVITY_POLLERS",
            help="Long polls for tool calls kept open at most. A paused worker's open polls still take tasks, "
            "each losing one lease TTL until the server's long poll expires. Default 1.",
        ),
    ] = None,
    workflow_pollers: Annotated[
        int | None,
        typer.Option(
            envvar="AGENTLEASE_WORKFLOW_POLLERS",
            help="Long polls for workflow tasks kept open at most (at least 2: sticky and normal). Default 2.",
        ),
    ] = None,
    identity: Annotated[
        str | None,
        typer.Option(
            "--identity",
            envvar="AGENTLEASE_WORKER_IDENTITY",
            help="Lease owner and Temporal identity; default HOST:PID.",
        ),
    ] = None,
    decision_mode: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_DECISION_MODE", help="open | authenticated (decisions signed). Default open."),
    ] = None,
    operator_keys: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_OPERATOR_KEYS", help="NAME=KEYFILE_OR_BASE64,... operator public keys."),
    ] = None,
    decision_max_age: Annotated[
        float | None,
        typer.Option(envvar="AGENTLEASE_DECISION_MAX_AGE", help="Seconds a signed decision stays valid. Default 900."),
    ] = None,
    redactor: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_REDACTOR", help="module:function redacting what the ledger stores."),
    ] = None,
    secret_provider: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_SECRET_PROVIDER", help="module:attribute with get(tool, name): tool secrets."),
    ] = None,
    shutdown_grace: Annotated[
        float | None,
        typer.Option(
            envvar="AGENTLEASE_SHUTDOWN_GRACE", help="Seconds running tools may finish after SIGTERM. Default 30."
        ),
    ] = None,
    max_concurrent_activities: Annotated[
        int | None,
        typer.Option(envvar="AGENTLEASE_MAX_CONCURRENT_ACTIVITIES", help="Tool calls run at once. Default 100."),
    ] = None,
    metrics_address: Annotated[
        str | None,
        typer.Option(
            envvar="AGENTLEASE_METRICS_ADDRESS",
            help="HOST:PORT serving GET /metrics (lease metrics and Temporal's). Default: not served.",
        ),
    ] = None,
    temporal_metrics: Annotated[
        bool | None,
        typer.Option(
            "--temporal-metrics/--no-temporal-metrics",
            envvar="AGENTLEASE_TEMPORAL_METRICS",
            help="Also serve Temporal's runtime metrics (temporal_*) on the metrics address. Default on.",
        ),
    ] = None,
    tracing: Annotated[
        bool | None,
        typer.Option(
            "--tracing/--no-tracing",
            envvar="AGENTLEASE_TRACING",
            help="Trace ledger operations with OpenTelemetry (OTEL_* variables; agentlease[otel]). Default off.",
        ),
    ] = None,
    workflow_modules: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_WORKFLOW_MODULES", help="Comma-separated modules whose workflows are served."),
    ] = None,
    plugins: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_PLUGINS", help="Comma-separated module:attribute Temporal client plugins."),
    ] = None,
    data_converter: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_DATA_CONVERTER", help="module:attribute of the Temporal data converter."),
    ] = None,
    ledger_pool_size: Annotated[
        int | None,
        typer.Option(envvar="AGENTLEASE_LEDGER_POOL_SIZE", help="PostgreSQL connections to the ledger. Default 10."),
    ] = None,
    migrate_on_start: Annotated[
        bool | None,
        typer.Option(
            "--migrate-on-start/--no-migrate-on-start",
            envvar="AGENTLEASE_MIGRATE_ON_START",
            help="Bring the ledger schema to the newest revision at start. Default off.",
        ),
    ] = None,
    http_base_url: Annotated[
        str | None, typer.Option(envvar="AGENTLEASE_HTTP_BASE_URL", help="Base of the HTTP tools' relative URLs.")
    ] = None,
    sql_target_url: Annotated[
        str | None, typer.Option(envvar="AGENTLEASE_SQL_TARGET_URL", help="Database the sql_upsert tool writes.")
    ] = None,
    http_allowed_hosts: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_HTTP_ALLOWED_HOSTS", help="Comma-separated hosts http_get may reach too."),
    ] = None,
    sql_allowed_tables: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_SQL_ALLOWED_TABLES", help="Comma-separated tables sql_upsert may write."),
    ] = None,
    fencing_key: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_FENCING_KEY", help="Key fencing tokens are signed with (16+ characters)."),
    ] = None,
    publish_base_url: Annotated[
        str | None, typer.Option(envvar="AGENTLEASE_PUBLISH_BASE_URL", help="Publishing service of http_publish.")
    ] = None,
    smtp_host: Annotated[
        str | None, typer.Option(envvar="AGENTLEASE_SMTP_HOST", help="SMTP server of smtp_send.")
    ] = None,
    smtp_port: Annotated[int | None, typer.Option(envvar="AGENTLEASE_SMTP_PORT", help="Its port. Default 25.")] = None,
) -> None:
    """Run a worker: the AgentRunWorkflow and every registered tool. Stops on SIGTERM/Ctrl-C.

    The connection flags (--temporal-address, --namespace, --task-queue, --ledger-url, --tool-modules)
    go before the command: `agentlease --task-queue Q worker`.
    """
    from agentlease.databases import display_url
    from agentlease.settings import default_identity
    from agentlease.tools._registry import load_registry
    from agentlease.worker import serve

    overrides = {
        "sticky_schedule_to_start": sticky_schedule_to_start,
        "activity_pollers": activity_pollers,
        "workflow_pollers": workflow_pollers,
        "worker_identity": identity,
        "decision_mode": decision_mode,
        "operator_keys": operator_keys,
        "decision_max_age": decision_max_age,
        "redactor": redactor,
        "secret_provider": secret_provider,
        "shutdown_grace": shutdown_grace,
        "max_concurrent_activities": max_concurrent_activities,
        "metrics_address": metrics_address,
        "temporal_metrics": temporal_metrics,
        "tracing": tracing,
        "workflow_modules": workflow_modules,
        "plugins": plugins,
        "data_converter": data_converter,
        "ledger_pool_size": ledger_pool_size,
        "migrate_on_start": migrate_on_start,
        "http_base_url": http_base_url,
        "http_allowed_hosts": http_allowed_hosts,
        "sql_allowed_tables": sql_allowed_tables,
        "fencing_key": fencing_key,
        "sql_target_url": sql_target_url,
        "publish_base_url": publish_base_url,
        "smtp_host": smtp_host,
        "smtp_port": smtp_port,
    }
    settings = _with(_settings(ctx), overrides)
    settings = _with(settings, {"worker_identity": settings.worker_identity or default_identity()})
    _log_in_one_line()
    tools = ", ".join(load_registry(settings.tool_modules).names())
    err.print(
        f"worker on {settings.temporal_address} namespace {settings.namespace} queue {settings.task_queue} "
        f"as {settings.worker_identity}, ledger {display_url(settings.ledger_url)}",
        markup=False,
    )
    err.print(f"tools: {tools}", markup=False)
    err.print(f"decisions in {settings.decision_mode} mode; payloads {_payloads(settings)}", markup=False)
    if settings.metrics_address is not None:
        err.print(f"lease metrics on http://{settings.metrics_address}/metrics")
    asyncio.run(serve(settings))


@app.command()
def run(
    ctx: typer.Context,
    plan_file: Annotated[Path, typer.Argument(help='Plan JSON: {"steps": [{"step_id", "tool", "arguments"}]}')],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the run with live progress until it ends.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    run_id: Annotated[
        str | None, typer.Option(help="Agent run id (workflow id); default from the plan or new.")
    ] = None,
) -> None:
    """Start an agent run from a plan file on the configured Temporal."""
    from agentlease.cli.plans import load_plan, with_run_id
    from agentlease.tools._registry import load_registry

    settings = _settings(ctx)
    plan = load_plan(plan_file, load_registry(settings.tool_modules))
    agent_run_id = run_id or plan.agent_run_id or f"run-{uuid.uuid4().hex[:12]}"
    plan = with_run_id(plan, agent_run_id)
    status = asyncio.run(_start_run(settings, plan, wait, as_json))
    if status is not None:
        _show_run(status, as_json)
        if status.status is RunState.WAITING:
            waiting = ", ".join(f"{t.step_id} is {t.status.value}" for t in status.tasks if t.status.awaits_decision)
            raise AgentLeaseError(f"agent run {agent_run_id} waits for a person ({waiting}); see `agentlease waiting`")
        if status.status is not RunState.COMPLETED:
            raise AgentLeaseError(f"agent run {agent_run_id} is {status.status.value}")
    elif as_json:
        out.print_json(data={"agent_run_id": agent_run_id})
    else:
        out.print(f"started agent run {agent_run_id}")


async def _start_run(settings: AgentLeaseSettings, plan: Any, wait: bool, as_json: bool) -> RunStatus | None:
    from rich.live import Live
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError

    from agentlease.temporal import connect
    from agentlease.workflow._plan import AgentRunWorkflow

    client = await connect(settings)
    try:
        handle = await client.start_workflow(
            AgentRunWorkflow.run, plan, id=plan.agent_run_id, task_queue=settings.task_queue
        )
    except WorkflowAlreadyStartedError:
        raise AgentLeaseError(
            f"cannot start run {plan.agent_run_id}: an agent run with this id is already running; "
            "choose another --run-id, or follow it with `agentlease status`"
        ) from None
    except RPCError as exc:
        raise AgentLeaseError(f"cannot start run {plan.agent_run_id}: {exc.message}") from None
    if not wait:
        return None
    if as_json or not out.is_terminal:
        return await _follow(client, handle, plan.agent_run_id, None)
    with Live(console=out, refresh_per_second=4) as live:
        return await _follow(client, handle, plan.agent_run_id, live)


async def _follow(client: Any, handle: Any, agent_run_id: str, live: Any) -> RunStatus:
    """Follow a run until it ends or waits for a person (``live``, a :class:`rich.live.Live` or
    ``None``: running tasks show their heartbeat).

    Temporal unreachable meanwhile (a restart): following goes on once it answers again, for at
    most :data:`_FOLLOW_OUTAGE`; then one ``error:`` line (the run itself goes on).
    """
    from temporalio.service import RPCError

    result = asyncio.ensure_future(handle.result())
    lost_since: float | None = None
    while True:
        if result.done():
            failure = result.exception()
            if not isinstance(failure, RPCError):
                break
            now = asyncio.get_running_loop().time()
            lost_since = now if lost_since is None else lost_since
            if now - lost_since > _FOLLOW_OUTAGE.total_seconds():
                raise AgentLeaseError(
                    f"lost Temporal while following agent run {agent_run_id}: {failure.message}; the run goes on, "
                    f"follow it with `agentlease status {agent_run_id}`"
                ) from None
            await asyncio.sleep(0.5)
            result = asyncio.ensure_future(handle.result())
            continue
        try:
            current = await handle.query(STATUS_QUERY, result_type=RunStatus, rpc_timeout=_RPC)
        except RPCError:
            current = None  # The run has not been picked up by a worker yet.
        if current is not None:
            if live is not None:
                with contextlib.suppress(RPCError):
                    current = await _with_heartbeats(client, await handle.describe(rpc_timeout=_RPC), current)
                live.update(run_table(current))
            if current.status is RunState.WAITING:
                result.cancel()
                return current
            lost_since = None
        await asyncio.wait([result], timeout=0.5)
    return await _result(result, agent_run_id)


_FOLLOW_OUTAGE = timedelta(seconds=60)
"""How long ``run --wait`` keeps following a run while Temporal does not answer. Default 60s."""


async def _result(result: Any, agent_run_id: str) -> RunStatus:
    from temporalio.client import WorkflowFailureError

    try:
        return await result
    except WorkflowFailureError as exc:
        raise AgentLeaseError(f"agent run {agent_run_id} failed: {one_line(exc.cause or exc)}") from None


async def _with_heartbeats(client: Any, description: Any, current: RunStatus) -> RunStatus:
    """``current`` with the stage and generation of its running tasks from their latest heartbeat.

    The workflow learns a task's stage and generation when its attempt ends; meanwhile Temporal
    keeps the attempt's latest heartbeat details (a :class:`LeaseHeartbeat`, a throttled copy of
    what the ledger recorded), as its UI shows them.
    """
    latest: dict[str, dict[str, Any]] = {}
    for pending in description.raw_description.pending_activities:
        if not pending.heartbeat_details.payloads:
            continue
        with contextlib.suppress(Exception):  # details of another shape: nothing to show
            [details] = await client.data_converter.decode(pending.heartbeat_details.payloads)
            latest[details["task_id"]] = details
    if not latest:
        return current
    tasks = [
        {
            **task.model_dump(),
            "stage": latest[task.task_id]["stage"],
            "claim_generation": latest[task.task_id]["claim_generation"],
        }
        if task.task_id in latest
        and task.status == "running"
        # the run's own view is live (its attempt signals each claim and stage): a heartbeat only fills a gap
        and (task.claim_generation or 0) < latest[task.task_id]["claim_generation"]
        else task.model_dump()
        for task in current.tasks
    ]
    return RunStatus.model_validate({**current.model_dump(), "tasks": tasks})


def _show_run(status: RunStatus, as_json: bool) -> None:
    if as_json:
        out.print_json(to_json(status))
    else:
        out.print(run_table(status))


@app.command()
def status(
    ctx: typer.Context,
    agent_run_id: Annotated[str, typer.Argument(help="The agent run (workflow) id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show one agent run: every task's status, stage, generation, attempts and receipt."""
    _show_run(asyncio.run(_run_status(_settings(ctx), agent_run_id)), as_json)


async def _run_status(settings: AgentLeaseSettings, agent_run_id: str) -> RunStatus:
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    from agentlease.cli.reaching import query_within
    from agentlease.temporal import connect

    client = await connect(settings)
    handle = client.get_workflow_handle(agent_run_id, result_type=RunStatus)
    try:
        description = await handle.describe()
        if description.status == WorkflowExecutionStatus.RUNNING:
            current = await query_within(handle, agent_run_id, settings.decision_timeout.total_seconds())
            return await _with_heartbeats(client, description, current)
        if description.status == WorkflowExecutionStatus.COMPLETED:
            return await handle.result()
        if description.status == WorkflowExecutionStatus.FAILED:
            return await _result(handle.result(), agent_run_id)  # raises with the cause
    except RPCError as exc:
        raise AgentLeaseError(f"agent run {agent_run_id}: {exc.message}") from None
    state = "in an unknown state" if description.status is None else description.status.name.lower()
    raise AgentLeaseError(f"agent run {agent_run_id} is {state}")


_Limit = Annotated[int | None, typer.Option("--limit", help="At most this many rows (a table shows 100 unless told).")]
_Json = Annotated[bool, typer.Option("--json", help="Print JSON.")]
_JsonList = Annotated[bool, typer.Option("--json", help="Print JSON: an array streamed a record at a time.")]


@app.command()
def tasks(
    ctx: typer.Context,
    run_filter: Annotated[str | None, typer.Option("--run", help="Only this agent run.")] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only tasks in this status (repeat, or comma-separate).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only tasks created since: 15m, 2h, 7d, or an ISO 8601 time.")
    ] = None,
    limit: _Limit = None,
    as_json: _JsonList = False,
) -> None:
    """List tasks as the ledger records them, oldest first."""
    from agentlease.cli.listings import check_limit, list_tasks, parse_since, parse_statuses
    from agentlease.clock import to_ms
    from agentlease.ledger.listing import TaskFilter

    check_limit(limit)
    which = TaskFilter(
        agent_run_id=run_filter,
        statuses=parse_statuses(status),
        since_ms=None if since is None else to_ms(parse_since(since)),
    )

    async def _list() -> None:
        async with _ledger(_settings(ctx)) as ledger:
            await list_tasks(ledger, which, limit=limit, as_json=as_json, out=out)

    asyncio.run(_list())


@app.command()
def runs(
    ctx: typer.Context,
    waiting_only: Annotated[
        bool, typer.Option("--waiting", help="Only runs with a task waiting for a person.")
    ] = False,
    status: Annotated[
        str | None, typer.Option("--status", help="Only runs in this state: running, waiting or completed.")
    ] = None,
    limit: _Limit = None,
    as_json: _JsonList = False,
) -> None:
    """List agent runs from the ledger, with how many of their tasks wait, are final, are settled."""
    from agentlease.cli.listings import check_limit, list_runs

    check_limit(limit)
    states = {RunState.RUNNING, RunState.WAITING, RunState.COMPLETED}
    try:
        wanted = None if status is None else RunState(status)
    except ValueError:
        wanted = None
    if status is not None and wanted not in states:
        raise ConfigurationError(f"bad --status {status!r}: one of running, waiting, completed")

    async def _list() -> None:
        async with _ledger(_settings(ctx)) as ledger:
            await list_runs(
                ledger,
                waiting_only=waiting_only or wanted is RunState.WAITING,
                state=wanted,
                limit=limit,
                as_json=as_json,
                out=out,
            )

    asyncio.run(_list())


@app.command()
def events(
    ctx: typer.Context,
    task_id: Annotated[str | None, typer.Argument(help="A task id; omit with --run.")] = None,
    run_filter: Annotated[str | None, typer.Option("--run", help="Every task of this agent run.")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep printing new entries as they are written, until Ctrl-C.")
    ] = False,
    limit: _Limit = None,
    as_json: _JsonList = False,
    html_file: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Write the timeline (a task's, or every task's of --run) to this self-contained HTML file."
        ),
    ] = None,
) -> None:
    """Show the evidence trail: claims, renewals, releases, settles, lease losses, late results."""
    from agentlease.cli.listings import check_limit, follow_events, list_events

    if task_id is None and run_filter is None:
        raise ConfigurationError("name a task id or --run RUN_ID")
    check_limit(limit)
    if follow and limit is not None:
        raise ConfigurationError("--follow prints every new entry; it takes no --limit")
    if html_file is not None:
        if follow or as_json or limit is not None:
            raise ConfigurationError("--html writes the whole timeline; it takes no --follow, --json or --limit")
        _write_timeline(_settings(ctx), task_id, run_filter, html_file)
        return

    async def _list() -> None:
        async with _ledger(_settings(ctx)) as ledger:
            if follow:
                from agentlease.shutdown import stop_event

                await follow_events(
                    ledger, task_id=task_id, agent_run_id=run_filter, as_json=as_json, out=out, stop=stop_event()
                )
            else:
                await list_events(
                    ledger, task_id=task_id, agent_run_id=run_filter, limit=limit, as_json=as_json, out=out
                )

    asyncio.run(_list())


def _write_timeline(settings: AgentLeaseSettings, task_id: str | None, agent_run_id: str | None, path: Path) -> None:
    """``events --html``: the timeline page of a task (or of every task of a run) as one file."""
    from agentlease.cli.listings import require_subject
    from agentlease.ui.timeline import run_timelines_page, timeline_page

    async def _page() -> str:
        async with _ledger(settings) as ledger:
            await require_subject(ledger, task_id, agent_run_id)
            if task_id is not None:
                return timeline_page(await ledger.get_task(task_id), await ledger.events(task_id))
            assert agent_run_id is not None
            tasks = [(task, await ledger.events(task.task_id)) for task in await ledger.list_tasks(agent_run_id)]
            return run_timelines_page(agent_run_id, tasks)

    page = asyncio.run(_page())
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise AgentLeaseError(f"cannot write {path}: {exc.strerror or exc}") from None
    out.print(f"wrote the lease timeline of {task_id or agent_run_id} to {path}", markup=False)


_By = Annotated[
    str | None,
    typer.Option(
        "--by",
        envvar="AGENTLEASE_OPERATOR",
        help="Who decides (kept in the evidence trail); with AGENTLEASE_OPERATOR_KEY, the key's operator.",
    ),
]
_Why = Annotated[str, typer.Option("--reason", help="Why (kept in the evidence trail).")]
_Run = Annotated[str, typer.Argument(help="The agent run (workflow) id.")]
_StepArg = Annotated[str, typer.Argument(help="The step id.")]


def _decide(settings: AgentLeaseSettings, agent_run_id: str, update: str, payload: Any, as_json: bool) -> None:
    from agentlease.cli.render import decided_title

    status = asyncio.run(_send_decision(settings, agent_run_id, update, payload))
    if as_json:
        _show_run(status, as_json)
    else:
        out.print(run_table(status, title=decided_title(status, update, getattr(payload, "step_id", None))))


async def _send_decision(
    settings: AgentLeaseSettings, agent_run_id: str, update: str, payload: Any, client: Any = None
) -> RunStatus:
    """Send a decision update to a run and wait for its answer, each step within the decision timeout.

    Raises:
        ConfigurationError: the run refused it (its validator); AgentLeaseError: no answer in time.
    """
    from temporalio.client import (
        WorkflowUpdateFailedError,
        WorkflowUpdateRPCTimeoutOrCancelledError,
        WorkflowUpdateStage,
    )
    from temporalio.service import RPCError

    from agentlease.temporal import connect

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
        from agentlease.decision_auth import OperatorKey

        key = OperatorKey(settings.operator_key)
        payload = payload.model_copy(update={"proof": key.sign(agent_run_id, update, payload.model_dump(mode="json"))})

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


def _step_decision(update: str, summary: str) -> None:
    """Register ``agentlease <update> RUN_ID STEP_ID --by --reason``: a decision on one step."""

    def command(
        ctx: typer.Context,
        agent_run_id: _Run,
        step_id: _StepArg,
        reason: _Why,
        by: _By = None,
        as_json: _Json = False,
    ) -> None:
        from agentlease.decisions import DecisionRequest

        payload = _request(DecisionRequest, _settings(ctx), step_id=step_id, by=by, reason=reason)
        _decide(_settings(ctx), agent_run_id, update, payload, as_json)

    command.__doc__ = summary
    app.command(name=update)(command)


_step_decision("approve", "Approve a tool call that waits for approval (every unsafe tool does, by default).")
_step_decision("reject", "Reject a tool call that waits for approval: it never runs.")


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

    def __bool__(self) -> bool:
        return bool(self.run or self.status or self.tool)


def _by_filter(
    settings: AgentLeaseSettings,
    kind: Any,
    model: Any,
    agent_run_id: str | None,
    filters: _Filters,
    by: str | None,
    reason: str,
    as_json: bool,
) -> bool:
    """Decide by filter when no RUN_ID is named (returns true); refuse both or neither.

    Raises:
        ConfigurationError: a RUN_ID and filters, or neither.
    """
    if agent_run_id is not None:
        if filters:
            raise ConfigurationError("name RUN_ID [STEP_ID], or filter with --run, --status or --tool, not both")
        return False
    if not filters:
        raise ConfigurationError("name RUN_ID [STEP_ID], or filter with --run, --status or --tool")

    def request(step: str) -> Any:
        return _request(model, settings, step_id=step, by=by, reason=reason)

    _bulk_decision(
        settings,
        kind,
        run_filter=filters.run,
        status=filters.status,
        tool=filters.tool,
        yes=filters.yes,
        request=request,
        as_json=as_json,
    )
    return True


def _bulk_decision(
    settings: AgentLeaseSettings,
    kind: Any,
    *,
    run_filter: str | None,
    status: list[str] | None,
    tool: str | None,
    yes: bool,
    request: Any,
    as_json: bool,
) -> None:
    """``redrive`` / ``cancel`` by filter: list the matching tasks, confirm, then decide each one."""
    from agentlease.cli.bulk import confirm_bulk, decide_each, select_tasks
    from agentlease.cli.listings import parse_statuses
    from agentlease.temporal import connect

    async def _select() -> list[Any]:
        async with _ledger(settings) as ledger:
            return await select_tasks(ledger, kind, run_filter, parse_statuses(status), tool)

    chosen = asyncio.run(_select())
    confirm_bulk(chosen, kind, yes=yes, out=out, err=err)

    async def _each() -> int:
        client = await connect(settings)
        return await decide_each(
            chosen,
            lambda task: _send_decision(settings, task.agent_run_id, kind.value, request(task.step_id), client),
            kind=kind,
            as_json=as_json,
            out=out,
            err=err,
        )

    if failed := asyncio.run(_each()):
        raise AgentLeaseError(f"{kind.value}: {failed} of {len(chosen)} tasks refused or not decided (see above)")


@app.command()
def redrive(
    ctx: typer.Context,
    agent_run_id: Annotated[str | None, typer.Argument(help="The agent run; omit to redrive by filter.")] = None,
    step_id: Annotated[str | None, typer.Argument(help="The step id.")] = None,
    *,
    by: _By = None,
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
    from agentlease.decisions import DecisionRequest
    from agentlease.enums import DecisionKind

    settings = _settings(ctx)
    filters = _Filters(run_filter, status, tool, yes)
    if _by_filter(settings, DecisionKind.REDRIVE, DecisionRequest, agent_run_id, filters, by, reason, as_json):
        return
    if agent_run_id is None or step_id is None:
        raise ConfigurationError("name RUN_ID STEP_ID, or filter with --run, --status or --tool")
    _decide(
        settings,
        agent_run_id,
        "redrive",
        _request(DecisionRequest, settings, step_id=step_id, by=by, reason=reason),
        as_json,
    )


@app.command()
def reconcile(
    ctx: typer.Context,
    agent_run_id: _Run,
    step_id: _StepArg,
    action: Annotated[str, typer.Option(help="confirm | retry | abandon")],
    reason: _Why,
    by: _By = None,
    external_id: Annotated[str | None, typer.Option(help="With confirm: the external system's id.")] = None,
    observed: Annotated[str | None, typer.Option(help="With confirm: what you saw, as a JSON object.")] = None,
    as_json: _Json = False,
) -> None:
    """Decide a task whose side effect is ambiguous: confirm it happened, retry with the same key, or abandon."""

    from agentlease.decisions import ReconcileRequest
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
        by=by,
        reason=reason,
        action=action,
        external_id=external_id,
        observed=seen,
    )

    async def _in_ledger() -> Any:
        async with _ledger(settings) as ledger:
            from agentlease.cli.reaching import reconciled_in_ledger

            return await reconciled_in_ledger(ledger, settings, agent_run_id, payload)

    record = asyncio.run(_in_ledger())
    if record is None:
        _decide(settings, agent_run_id, "reconcile", payload, as_json)
    elif as_json:
        out.print_json(to_json(record))
    else:
        out.print(tasks_table([record], title=f"{record.task_id}: {payload.action} recorded; it stays cancelled"))


@app.command()
def cancel(
    ctx: typer.Context,
    agent_run_id: Annotated[
        str | None, typer.Argument(help="The agent run (workflow) id; omit to cancel by filter.")
    ] = None,
    step_id: Annotated[str | None, typer.Argument(help="The step id; omit to cancel the whole run.")] = None,
    *,
    by: _By = None,
    reason: _Why,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    run_filter: _RunFilter = None,
    status: _StatusFilter = None,
    tool: _ToolFilter = None,
    yes: _Yes = False,
) -> None:
    """Cancel one task or the whole run; cancelled stays cancelled.

    With --run/--status/--tool instead of RUN_ID: every matching task that can be cancelled, after a
    confirmation (--yes skips it).
    """
    from agentlease.decisions import CancelRequest
    from agentlease.enums import DecisionKind

    settings = _settings(ctx)
    filters = _Filters(run_filter, status, tool, yes)
    if _by_filter(settings, DecisionKind.CANCEL, CancelRequest, agent_run_id, filters, by, reason, as_json):
        return
    assert agent_run_id is not None
    _decide(
        settings,
        agent_run_id,
        "cancel",
        _request(CancelRequest, settings, step_id=step_id, by=by, reason=reason),
        as_json,
    )
    err.print(
        "the cancel is recorded in the ledger; an attempt still running stops at its next renewal, which the "
        "ledger refuses (cancelled stays cancelled)"
    )


def _request(model: Any, settings: AgentLeaseSettings, **fields: Any) -> Any:
    """The decision payload; with ``AGENTLEASE_OPERATOR_KEY`` its operator is the key's (``--by`` may
    only repeat it), and :func:`_decide` signs it."""
    if settings.operator_key is not None:
        from agentlease.decision_auth import OperatorKey

        operator = OperatorKey(settings.operator_key).operator
        if fields.get("by") not in (None, operator):
            raise ConfigurationError(
                f"--by {fields['by']}: this decision is signed with the key of {operator!r} "
                "(AGENTLEASE_OPERATOR_KEY); the operator is the key's"
            )
        fields["by"] = operator
    elif fields.get("by") is None:
        raise ConfigurationError("--by is required (who decides), unless AGENTLEASE_OPERATOR_KEY signs the decision")
    try:
        return model(**fields)
    except ValidationError as exc:
        raise ConfigurationError(f"bad decision: {describe_validation_error(exc)}") from None


@app.command()
def waiting(ctx: typer.Context, limit: _Limit = None, as_json: _JsonList = False) -> None:
    """List every task waiting for a person, why, and the commands that decide it (from the ledger)."""
    from agentlease.cli.listings import check_limit, list_waiting

    check_limit(limit)

    async def _list() -> None:
        async with _ledger(_settings(ctx)) as ledger:
            await list_waiting(ledger, limit=limit, as_json=as_json, out=out)

    asyncio.run(_list())


@app.command()
def sweep(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="Sweep once, print the counts and exit.")] = False,
    interval_s: Annotated[float, typer.Option(help="Seconds between sweeps.")] = 5.0,
    metrics_address: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_METRICS_ADDRESS", help="HOST:PORT serving the sweeper's GET /metrics."),
    ] = None,
) -> None:
    """Record and classify leases that lapsed on the ledger's clock (the expired-lease sweeper)."""
    from agentlease.metrics import serving_metrics
    from agentlease.recovery._sweeper import ExpiredLeaseSweeper, SweeperSettings
    from agentlease.shutdown import stop_event
    from agentlease.tools._registry import load_registry

    settings = _with(_settings(ctx), {"metrics_address": metrics_address})
    limits = {spec.name: spec.max_attempts for spec in load_registry(settings.tool_modules).specs()}
    try:
        options = SweeperSettings(interval=timedelta(seconds=interval_s), max_attempts_by_tool=limits)
    except ValueError as exc:
        raise ConfigurationError(f"bad sweeper setting: {exc}") from None

    async def _sweep() -> None:
        async with _ledger(settings) as ledger:
            sweeper = ExpiredLeaseSweeper(ledger, options)
            if once:
                result = await sweeper.run_once()
                out.print(
                    f"examined {result.examined}: released {result.released}, needs reconciliation "
                    f"{result.needs_reconciliation}, dead-lettered {result.dead_lettered}, skipped {result.skipped}"
                )
                return
            # The sweeper's expiries and parked tasks are lease metrics of this process.
            with serving_metrics(settings.metrics_address):
                await sweeper.run(stop_event())

    asyncio.run(_sweep())


@app.command()
def ui(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(envvar="AGENTLEASE_UI_HOST", help="Address to serve on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="AGENTLEASE_UI_PORT", help="Port to serve on.")] = 8080,
    temporal_ui: Annotated[
        str | None,
        typer.Option(envvar="AGENTLEASE_TEMPORAL_UI", help="The Temporal UI's address, for links to each run."),
    ] = None,
) -> None:
    """Serve a read-only web view of the ledger: runs, tasks and each task's lease timeline."""
    from agentlease.cli.serving import bound, serve_until_stopped
    from agentlease.ui.app import ui_app

    settings = _settings(ctx)

    async def _serve(sock: Any) -> None:
        async with _ledger(settings) as ledger:
            app = ui_app(ledger, temporal_ui=temporal_ui, namespace=settings.namespace)
            await serve_until_stopped(
                app,
                sock,
                lambda: err.print(f"lease timelines on http://{host}:{port}/runs/RUN_ID (read-only); Ctrl-C stops"),
            )

    with bound(host, port) as sock:
        asyncio.run(_serve(sock))


def _payloads(settings: AgentLeaseSettings) -> str:
    """How this process's Temporal payloads travel, for the worker's banner."""
    if settings.payload_codec:
        return f"through codec {settings.payload_codec}"
    return "encrypted (AGENTLEASE_CODEC_KEYS)" if settings.codec_keys else "in plain JSON (no codec)"


@app.command()
def purge(
    ctx: typer.Context,
    older_than: Annotated[str, typer.Option("--older-than", help="Age of a final task's last change: 30d, 12h, 2w.")],
    keep_receipts: Annotated[
        bool, typer.Option("--keep-receipts", help="Keep receipts: their idempotency keys still deduplicate.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only; delete nothing.")] = False,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Tasks per transaction.")] = 500,
) -> None:
    """Delete the evidence of final tasks older than an age (tasks, trail, receipts), in batches."""
    from agentlease.ledger.retention import parse_age
    from agentlease.ledger.retention import purge as purge_ledger

    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise ConfigurationError(f"--older-than: {exc}") from None
    if batch_size < 1:
        raise ConfigurationError("--batch-size must be at least 1")

    async def _purge() -> Any:
        async with _ledger(_settings(ctx)) as ledger:
            return await purge_ledger(ledger, age, keep_receipts=keep_receipts, dry_run=dry_run, batch_size=batch_size)

    counts = asyncio.run(_purge())
    verb = "would delete" if dry_run else "deleted"
    kept = " (receipts kept)" if keep_receipts else ""
    out.print(
        f"{verb} {counts.tasks} tasks, {counts.events} evidence entries, {counts.receipts} receipts{kept}"
        + ("" if dry_run else f" in {counts.batches} batches")
    )


@app.command("advise-ttl")
def advise_ttl(
    ctx: typer.Context,
    tool: Annotated[str | None, typer.Option("--tool", help="Only this tool.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only renewals since: an ISO time or 30m, 12h, 7d back.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Recommend a lease TTL per tool from the renewal history (gaps, stage durations, expiries)."""
    from agentlease.cli.advice import advice_json, advice_table, tradeoff_lines
    from agentlease.ttl_advice import advise, read_samples, since_argument

    async def _advise() -> list[Any]:
        async with _ledger(_settings(ctx)) as ledger:
            start = None
            if since is not None:
                try:
                    start = since_argument(since, await ledger.db_now())
                except ValueError as exc:
                    raise ConfigurationError(f"bad --since: {exc}") from None
            return advise(await read_samples(ledger, tool=tool, since=start))

    advice = asyncio.run(_advise())
    if not advice:
        raise AgentLeaseError(f"no renewal history{f' for tool {tool}' if tool else ''} in the ledger yet")
    if as_json:
        out.print_json(to_json(advice_json(advice)))
        return
    for item in advice:
        out.print(advice_table(item))
        for line in [*tradeoff_lines(item), *(f"  warning: {w}" for w in item.warnings)]:
            out.print(line, soft_wrap=True, markup=False)


@db_app.command("upgrade")
def db_upgrade(ctx: typer.Context) -> None:
    """Create or migrate the ledger schema to the newest revision."""
    from agentlease.databases import display_url
    from agentlease.ledger.migrate import upgrade

    settings = _settings(ctx)

    async def _upgrade() -> None:
        async with _ledger(settings, must_exist=False) as ledger:
            await upgrade(ledger.database)

    asyncio.run(_upgrade())
    out.print(f"ledger {display_url(settings.ledger_url)} is at the newest schema")


@db_app.command("grant")
def db_grant(
    ctx: typer.Context,
    worker_role: Annotated[str | None, typer.Option(help="Role the workers connect as: lease operations only.")] = None,
    operator_role: Annotated[str | None, typer.Option(help="Role of operators: reads and decisions.")] = None,
    reader_role: Annotated[str | None, typer.Option(help="Role that only reads.")] = None,
    apply: Annotated[bool, typer.Option("--apply", help="Run the statements on the ledger (as its owner).")] = False,
) -> None:
    """Print (or --apply) the least-privilege grants of the PostgreSQL ledger's roles (docs/security.md)."""
    from sqlalchemy import text

    from agentlease.databases import display_url
    from agentlease.ledger.grants import LedgerRoles, grant_statements

    try:
        statements = grant_statements(LedgerRoles(worker_role, operator_role, reader_role))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if not apply:
        for statement in statements:
            out.print(statement, markup=False, soft_wrap=True)
        return
    settings = _settings(ctx)
    if not settings.ledger_url.startswith("postgresql"):
        raise ConfigurationError("db grant --apply needs a PostgreSQL ledger (AGENTLEASE_LEDGER_URL)")

    async def _apply() -> None:
        async with _ledger(settings) as ledger:

            def grant_tx(conn: Any) -> None:
                for statement in statements:
                    conn.execute(text(statement))

            await ledger.database.write(grant_tx)

    asyncio.run(_apply())
    out.print(f"granted on {display_url(settings.ledger_url)}: {len(statements)} statements")


@app.command()
def demo(
    ctx: typer.Context,
    timeout_s: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 180.0,
) -> None:
    """Run the bundled example plans end to end on the embedded default, then stop everything."""
    from agentlease.cli.local import run_demo
    from agentlease.shutdown import stopped_by_signals

    settled = asyncio.run(stopped_by_signals(run_demo(_settings(ctx), EXAMPLE_PLANS, out, err, timeout_s=timeout_s)))
    if not settled:
        raise AgentLeaseError("not every task of the demo settled")


@app.command()
def dev(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="Temporal frontend port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal UI port.")] = 8233,
    with_worker: Annotated[
        bool,
        typer.Option(
            "--worker/--no-worker",
            help="Run a worker in this process (it takes the queue's tool calls beside your own workers).",
        ),
    ] = True,
) -> None:
    """Run the embedded stack (Temporal dev server, ledger, example services and a worker) until Ctrl-C.

    Prints where the Temporal UI is and the exports a second shell needs.
    """
    from agentlease.cli.local import run_dev

    asyncio.run(run_dev(_settings(ctx), err, port=port, ui_port=ui_port, worker=with_worker))


def _run(argv: Sequence[str] | None) -> int:
    """Run the CLI; every expected failure becomes one line on stderr. Returns the exit code."""
    try:
        code = app(args=list(argv) if argv is not None else None, standalone_mode=False)
    except typer.Abort:
        err.print("aborted")
        return 130
    except typer.TyperException as exc:  # click's usage errors, vendored by typer since 0.26
        # no_args_is_help: typer has already printed the help; it stays silent here too.
        if type(exc).__name__ != "NoArgsIsHelpError":
            err.print(f"error: {exc.format_message()}")
        return 2
    except ConfigurationError as exc:
        err.print(f"error: {exc}")
        return 2
    except AgentLeaseError as exc:
        err.print(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except OSError as exc:  # writing the output failed: a full disk, a closed pipe
        with contextlib.suppress(OSError):
            err.print(f"error: cannot write the output: {one_line(exc)}")
        return 1
    # Without standalone mode, typer returns the code of `typer.Exit` (and of --help) instead of exiting.
    return code if isinstance(code, int) else 0


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry point: run the CLI, then leave without finalizing the interpreter.

    Everything the command started has been stopped by then (worker, dev server, ledger thread).
    What can still run is the Temporal SDK's Rust runtime: its threads may call into Python while
    the interpreter finalizes and abort the process with "PyGILState_Release: thread state must be
    current" (temporalio/sdk-python#300), turning a clean exit into SIGABRT. So the exit code is
    delivered with ``os._exit`` after flushing logs and standard streams.
    """
    code = _run(argv)
    from agentlease.tracing import flush

    flush()  # spans still buffered for the OTLP exporter (tracing on), before the exit below skips atexit
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a reader that went away: nothing left to deliver to
            stream.flush()
    os._exit(code)


def _security_commands() -> None:
    from agentlease.cli.security import codec_server, keys_app

    app.add_typer(keys_app, name="keys")
    app.command("codec-server")(codec_server)


_security_commands()

if __name__ == "__main__":
    main()
