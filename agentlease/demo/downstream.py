"""The real downstream systems of the demo and the tests, each with its own database under the data dir: files
(``http_get``), a SQL target (``sql_upsert``), publishing (``http_publish``) and SMTP (``smtp_send``).
``docs/plans.md`` ("Built-in tools")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import MetaData
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from agentlease.demo import mail, publishing
from agentlease.demo.serving import bind_loopback, serve_app
from agentlease.ledger.engine import create_async_database_engine
from agentlease.tools.builtin.sql_upsert import records_table

__all__ = ["Downstream", "bind_loopback", "prepare_sql_target", "running_downstream", "serve_app"]

FILES_DIR = Path(__file__).parent / "files"
"""The real files ``http_get`` fetches in the bundled plans."""

TARGET_TABLES = ("inventory",)
"""Tables the bundled plans write with ``sql_upsert``."""


@dataclass(frozen=True)
class Downstream:
    """Where the running downstream systems are (the file server's files under ``/files/``), and the databases
    of the publishing service and the SMTP server."""

    http_base_url: str
    sql_target_url: str
    publish_base_url: str
    smtp_host: str
    smtp_port: int
    publish_database_url: str
    mail_database_url: str


async def prepare_sql_target(url: str, tables: tuple[str, ...] = TARGET_TABLES) -> None:
    """Create the target tables (``records_table`` shape) if they do not exist."""
    engine = create_async_database_engine(url)
    metadata = MetaData()
    for name in tables:
        records_table(name, metadata)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
    finally:
        await engine.dispose()


@asynccontextmanager
async def running_downstream(data_dir: Path, *, fencing_key: bytes | None = None) -> AsyncIterator[Downstream]:
    """Start the downstream systems, each a SQLite file under ``data_dir``; with ``fencing_key`` publishing
    accepts only fencing tokens signed with it (``AGENTLEASE_FENCING_KEY``)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    sql_target_url = f"sqlite:///{(data_dir / 'target.db').resolve()}"
    await prepare_sql_target(sql_target_url)
    publish_database_url = publishing.database_url(data_dir)
    mail_database_url = mail.database_url(data_dir)
    files = Starlette(routes=[Mount("/files", app=StaticFiles(directory=FILES_DIR), name="files")])
    async with AsyncExitStack() as stack:
        http_base_url = await stack.enter_async_context(serve_app(files))
        publish_base_url = await stack.enter_async_context(
            publishing.running_publishing(publish_database_url, fencing_key=fencing_key)
        )
        smtp_host, smtp_port = await stack.enter_async_context(mail.running_mail(mail_database_url))
        yield Downstream(
            http_base_url=http_base_url,
            sql_target_url=sql_target_url,
            publish_base_url=publish_base_url,
            smtp_host=smtp_host,
            smtp_port=smtp_port,
            publish_database_url=publish_database_url,
            mail_database_url=mail_database_url,
        )
