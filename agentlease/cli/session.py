"""What every command shares: its consoles, its settings, the ledger it opens, and the extras it needs."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, TypeVar

import typer
from rich.console import Console

from agentlease.errors import ConfigurationError, LedgerUnavailableError, one_line
from agentlease.settings import AgentLeaseSettings

out = Console(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)

T = TypeVar("T")

RPC = timedelta(seconds=5)
"""Deadline of one query to a run."""


def settings(ctx: typer.Context) -> AgentLeaseSettings:
    """The settings of this invocation: variables, then the global flags, then the command's own."""
    return ctx.obj


def log_in_one_line() -> None:
    """Log lines on stderr as ``<time> <level> <logger>: <message>``: the SDK's warnings, and agentlease's own
    one-line reports (a lost lease, a ledger outage, a clock behind the ledger) from INFO up."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentlease").setLevel(logging.INFO)


EXTRAS = {"ui": ("starlette", "uvicorn"), "demo": ("starlette", "uvicorn", "aiosmtpd")}
"""The packages of each optional extra a command needs (``pyproject.toml``)."""


def require_extra(extra: str, command: str) -> None:
    """Refuse ``command`` (ConfigurationError, one line) when a package of ``extra`` is not installed."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ValueError:  # a module without a spec: as good as missing
            found = False
        if not found:
            raise ConfigurationError(
                f"agentlease {command} needs the {extra!r} extra: pip install 'agentlease[{extra}]'"
            )


@asynccontextmanager
async def ledger(settings: AgentLeaseSettings, *, must_exist: bool = True) -> AsyncIterator[Any]:
    """The configured ledger; a read on a SQLite file that does not exist is an error, not a new file."""
    from sqlalchemy.exc import SQLAlchemyError

    from agentlease.ledger.engine import display_url, is_missing_schema, sqlite_path
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
    opened = Ledger.from_url(settings.ledger_url, pool_size=settings.ledger_pool_size)
    try:
        yield opened
    except (SQLAlchemyError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            raise  # the output's reader went away: not the ledger's failure
        if is_missing_schema(exc):
            cause = "the ledger has no schema yet; run `agentlease db upgrade`"
        else:
            cause = one_line(getattr(exc, "orig", None) or exc)
        raise LedgerUnavailableError(f"ledger {display_url(settings.ledger_url)}: {cause}") from None
    finally:
        await opened.close()


def in_ledger(settings: AgentLeaseSettings, use: Callable[[Any], Awaitable[T]], *, must_exist: bool = True) -> T:
    """Run ``use`` on the configured ledger (:func:`ledger`, closed after) and return what it returns."""

    async def run() -> T:
        async with ledger(settings, must_exist=must_exist) as opened:
            return await use(opened)

    return asyncio.run(run())
