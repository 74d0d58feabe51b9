"""The ``agentlease`` command line (typer + rich), its commands grouped by noun in the modules beside this one;
every setting's flag shows its ``AGENTLEASE_*`` variable in ``--help``. An error is one line on stderr with exit
1 (a failed operation) or 2 (bad input). ``docs/cli.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Annotated, NoReturn

import typer

# Temporal's client is imported by the commands that reach Temporal: a ledger-only command (tasks,
# events, waiting, runs) starts without it.
from agentlease.cli import db, decide, runs, views
from agentlease.cli.options import GLOBAL, UI, WORKER, setting_flags
from agentlease.cli.runs import run_status as _run_status
from agentlease.cli.security import codec_server, keys_app, startup_warnings
from agentlease.cli.session import err, log_in_one_line, out, require_extra
from agentlease.cli.session import settings as _settings
from agentlease.errors import AgentLeaseError, ConfigurationError, one_line, printable
from agentlease.runtime.shutdown import exit_process
from agentlease.settings import AgentLeaseSettings, with_overrides

app = typer.Typer(
    name="agentlease",
    help="Leased agent tool calls on Temporal: fencing tokens, idempotency keys, settlement receipts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
@setting_flags(*GLOBAL)
def _global(ctx: typer.Context) -> None:
    """The global flags, applied to ``ctx.obj`` by :func:`setting_flags` before any command runs."""


@setting_flags(*WORKER)
def worker(ctx: typer.Context) -> None:
    """Run a worker: the AgentRunWorkflow and every registered tool. Stops on SIGTERM/Ctrl-C.

    The connection flags (--temporal-address, --namespace, --task-queue, --ledger-url, --tool-modules)
    go before the command: `agentlease --task-queue Q worker`.
    """
    from agentlease.ledger.engine import display_url
    from agentlease.settings import default_identity
    from agentlease.tools._registry import load_registry
    from agentlease.worker import serve

    settings = _settings(ctx)
    settings = with_overrides(settings, {"worker_identity": settings.worker_identity or default_identity()})
    log_in_one_line()
    tools = ", ".join(load_registry(settings.tool_modules).names())
    err.print(
        f"worker on {settings.temporal_address} namespace {settings.namespace} queue {settings.task_queue} "
        f"as {settings.worker_identity}, ledger {display_url(settings.ledger_url)}",
        markup=False,
    )
    err.print(f"tools: {tools}", markup=False)
    err.print(f"decisions in {settings.decision_mode} mode; payloads {_payloads(settings)}", markup=False)
    for warning in startup_warnings(settings):
        err.print(warning, markup=False)
    if settings.metrics_address is not None:
        err.print(f"lease metrics on http://{settings.metrics_address}/metrics")
    asyncio.run(serve(settings))


@setting_flags(*UI)
def ui(ctx: typer.Context) -> None:
    """Serve a read-only web view of the ledger: runs, tasks and each task's lease timeline."""
    require_extra("ui", "ui")
    from agentlease.cli.serving import serve_ui

    serve_ui(_settings(ctx), lambda line: err.print(line, markup=False))


def _payloads(settings: AgentLeaseSettings) -> str:
    """How this process's Temporal payloads travel, for the worker's banner."""
    if settings.payload_codec:
        return f"through codec {settings.payload_codec}"
    return "encrypted (AGENTLEASE_CODEC_KEYS)" if settings.codec_keys else "in plain JSON (no codec)"


def demo(
    ctx: typer.Context, timeout_s: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 180.0
) -> None:
    """Show what a lease changes: a worker paused mid-write, without a lease and with one; then stop everything.

    On the embedded default, with the bundled plans and example agents beside it. Exit 0 once every task settled.
    """
    require_extra("demo", "demo")
    from agentlease.demo.cli.local import EXAMPLE_PLANS, run_demo
    from agentlease.runtime.shutdown import stopped_by_signals

    settled = asyncio.run(stopped_by_signals(run_demo(_settings(ctx), EXAMPLE_PLANS, out, err, timeout_s=timeout_s)))
    if not settled:
        raise AgentLeaseError("not every task of the demo settled")


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
    require_extra("demo", "dev")
    from agentlease.demo.cli.local import run_dev

    asyncio.run(run_dev(_settings(ctx), err, port=port, ui_port=ui_port, worker=with_worker))


def _run(argv: Sequence[str] | None) -> int:
    """Run the CLI; every expected failure becomes one line on stderr (:func:`_error`). Returns the exit code."""
    try:
        code = app(args=list(argv) if argv is not None else None, standalone_mode=False)
    except typer.Abort:
        err.print("aborted")
        return 130
    except typer.TyperException as exc:  # click's usage errors, vendored by typer since 0.26
        # no_args_is_help: typer has already printed the help; it stays silent here too.
        if type(exc).__name__ != "NoArgsIsHelpError":
            _error(exc.format_message())
        return 2
    except AgentLeaseError as exc:  # bad input (a ConfigurationError) is 2, a failed operation 1
        _error(str(exc))
        return 2 if isinstance(exc, ConfigurationError) else 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except OSError as exc:  # writing the output failed: a full disk, a closed pipe
        with contextlib.suppress(OSError):
            _error(f"cannot write the output: {one_line(exc)}")
        return 1
    # Without standalone mode, typer returns the code of `typer.Exit` (and of --help) instead of exiting.
    return code if isinstance(code, int) else 0


def _error(message: str) -> None:
    """Print ``error: <message>`` on stderr, as it is (no markup), each unprintable character escaped: a run id
    or step id the user gave holding a bidi override or an escape sequence cannot rewrite the terminal line."""
    err.print(f"error: {printable(message)}", markup=False)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry point: run the CLI, then leave (:func:`agentlease.runtime.shutdown.exit_process`)."""
    exit_process(_run(argv))


def _register() -> None:
    """Every command, in the order ``--help`` lists them."""
    app.add_typer(db.db_app, name="db")
    app.command()(worker)
    app.command()(runs.run)
    app.command()(runs.status)
    app.command()(views.tasks)
    app.command()(views.runs)
    app.command()(views.events)
    app.command("approve")(decide.approve)
    app.command("reject")(decide.reject)
    app.command()(decide.redrive)
    app.command()(decide.reconcile)
    app.command()(decide.cancel)
    app.command()(views.waiting)
    app.command()(db.sweep)
    app.command()(ui)
    app.command()(db.purge)
    app.command("advise-ttl")(views.advise_ttl)
    app.command()(demo)
    app.command()(dev)
    app.add_typer(keys_app, name="keys")
    app.command("codec-server")(codec_server)


_register()

__all__ = ["_run_status", "app", "main"]

if __name__ == "__main__":
    main()
