"""The ledger database: ``db upgrade``, ``db grant``, ``purge`` and the expired-lease ``sweep``."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

import typer

from agentlease.cli.options import SWEEP, setting_flags
from agentlease.cli.session import err, in_ledger, out
from agentlease.cli.session import settings as _settings
from agentlease.errors import ConfigurationError

db_app = typer.Typer(help="The ledger database.", no_args_is_help=True)


@setting_flags(*SWEEP)
def sweep(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="Sweep once, print the counts and exit.")] = False,
    interval_s: Annotated[float, typer.Option(help="Seconds between sweeps.")] = 5.0,
) -> None:
    """Record and classify leases that lapsed on the ledger's clock (the expired-lease sweeper)."""
    from agentlease.observability.metrics import serving_metrics
    from agentlease.recovery._sweeper import ExpiredLeaseSweeper, SweeperSettings
    from agentlease.runtime.shutdown import stop_event

    settings = _settings(ctx)
    if settings.tool_modules:
        from agentlease.tools._registry import load_registry

        load_registry(settings.tool_modules, builtins=False)  # a module that does not import fails now

    def limits() -> dict[str, int]:
        """Read when a lease is first classified: an idle sweep imports no tool (the built-in ones import Temporal)."""
        from agentlease.tools._registry import load_registry

        return {spec.name: spec.max_attempts for spec in load_registry(settings.tool_modules).specs()}

    try:
        options = SweeperSettings(interval=timedelta(seconds=interval_s), approval_warning=settings.approval_warning)
    except ValueError as exc:
        raise ConfigurationError(f"bad sweeper setting: {exc}") from None

    async def _sweep(ledger: Any) -> None:
        sweeper = ExpiredLeaseSweeper(ledger, options, tool_limits=limits)
        if once:
            result = await sweeper.run_once()
            out.print(
                f"examined {result.examined}: released {result.released}, needs reconciliation "
                f"{result.needs_reconciliation}, dead-lettered {result.dead_lettered}, skipped {result.skipped}; "
                f"approvals about to lapse {result.approvals_expiring}"
            )
            return
        with serving_metrics(settings.metrics_address):  # the sweeper's expiries and parks are metrics of this process
            await sweeper.run(stop_event())

    in_ledger(settings, _sweep)


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
    from agentlease.ledger.retention import MAX_BATCH_SIZE, parse_age
    from agentlease.ledger.retention import purge as purge_ledger

    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise ConfigurationError(f"--older-than: {exc}") from None
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ConfigurationError(f"--batch-size is from 1 to {MAX_BATCH_SIZE} tasks")
    counts = in_ledger(
        _settings(ctx),
        lambda ledger: purge_ledger(ledger, age, keep_receipts=keep_receipts, dry_run=dry_run, batch_size=batch_size),
    )
    verb = "would delete" if dry_run else "deleted"
    kept = " (receipts kept)" if keep_receipts else ""
    out.print(
        f"{verb} {counts.tasks} tasks, {counts.events} evidence entries, {counts.receipts} receipts{kept}"
        + ("" if dry_run else f" in {counts.batches} batches")
    )


@db_app.command("upgrade")
def db_upgrade(ctx: typer.Context) -> None:
    """Create or migrate the ledger schema to the newest revision."""
    from agentlease.ledger.engine import display_url
    from agentlease.ledger.migrate import upgrade

    settings = _settings(ctx)
    in_ledger(settings, lambda ledger: upgrade(ledger.database), must_exist=False)
    out.print(f"ledger {display_url(settings.ledger_url)} is at the newest schema")


@db_app.command("grant")
def db_grant(
    ctx: typer.Context,
    worker_role: Annotated[str | None, typer.Option(help="Role the workers connect as: lease operations only.")] = None,
    operator_role: Annotated[str | None, typer.Option(help="Role of operators: reads and decisions.")] = None,
    reader_role: Annotated[str | None, typer.Option(help="Role that only reads.")] = None,
    apply: Annotated[bool, typer.Option("--apply", help="Run the statements on the ledger (as its owner).")] = False,
) -> None:
    """Print (or --apply) the least-privilege grants of the PostgreSQL ledger's roles (docs/security-operations.md)."""
    from sqlalchemy import text

    from agentlease.ledger.engine import display_url
    from agentlease.ledger.grants import GUARD_TRIGGERS, GUARDS_PRESENT, LedgerRoles, grant_statements

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

    def grant_tx(conn: Any) -> int:
        for statement in statements:
            conn.execute(text(statement))
        guards: int = conn.execute(text(GUARDS_PRESENT), {"names": list(GUARD_TRIGGERS)}).scalar_one()
        return guards

    guards = in_ledger(settings, lambda ledger: ledger.database.write(grant_tx))
    out.print(f"granted on {display_url(settings.ledger_url)}: {len(statements)} statements")
    if guards < len(GUARD_TRIGGERS):
        err.print(
            "warning: this ledger has no row guards yet (schema revision 0006): run `agentlease db upgrade` as its "
            "owner, or the worker role can still rewrite generations, statuses and receipts",
            markup=False,
        )
