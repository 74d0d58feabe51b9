"""A real SMTP server, the downstream of ``smtp_send``: records every message in a table ``messages``, answers
``250 OK: queued as <id>``, and answers ``XLOOKUP <Message-ID>`` (``250 found: ...`` or ``550 not found``) for
``smtp_send``'s readback probe. ``docs/plans.md`` ("Built-in tools")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email import message_from_bytes, policy
from pathlib import Path
from typing import Any

try:
    from aiosmtpd.smtp import SMTP, Envelope, Session
except ImportError as _import_error:  # pragma: no cover - depends on the installed extras
    raise ImportError("the demo mail server needs the 'demo' extra: pip install 'agentlease[demo]'") from _import_error
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, Text, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentlease.clock import db_now_ms
from agentlease.demo.serving import bind_loopback
from agentlease.ledger.engine import create_async_database_engine
from agentlease.ledger.tables import NAMING_CONVENTION
from agentlease.tools.builtin.smtp_send import IDEMPOTENCY_HEADER, LOOKUP_COMMAND

DATABASE_FILE = "mail.db"
"""The server's SQLite file under the data dir."""

metadata = MetaData(naming_convention=NAMING_CONVENTION)

messages = Table(
    "messages",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(998)),
    Column("mail_from", String(320), nullable=False),
    Column("rcpt_to", Text, nullable=False),
    Column("subject", Text),
    Column("idempotency_key", String(998)),
    Column("size_bytes", Integer, nullable=False),
    Column("received_at_ms", BigInteger, nullable=False),
)
"""One row per message received; ``rcpt_to`` is a JSON list of the envelope's recipients."""


@dataclass(frozen=True)
class ReceivedMessage:
    """A message as the server recorded it: ``id`` (named in the 250 reply), headers, envelope, size, and
    ``received_at_ms`` (epoch ms, the database's clock)."""

    id: int
    message_id: str | None
    mail_from: str
    rcpt_to: list[str]
    subject: str | None
    idempotency_key: str | None
    size_bytes: int
    received_at_ms: int

    @classmethod
    def from_row(cls, row: Any) -> ReceivedMessage:
        return cls(**{**row._mapping, "rcpt_to": json.loads(row.rcpt_to)})


def database_url(data_dir: Path) -> str:
    """URL of the server's SQLite file under ``data_dir``."""
    return f"sqlite:///{(data_dir / DATABASE_FILE).resolve()}"


class RecordingHandler:
    """aiosmtpd handler: records every message in ``messages``, then answers 250; ``answers_lookups`` false
    answers ``XLOOKUP`` with ``502``, as a server without the extension would."""

    answers_lookups = True

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def handle_EHLO(
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str, responses: list[str]
    ) -> list[str]:
        """Advertise ``XLOOKUP`` in the ``EHLO`` reply (before its last line)."""
        session.host_name = hostname
        if not self.answers_lookups:
            return responses
        return [*responses[:-1], f"250-{LOOKUP_COMMAND}", responses[-1]]

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content if isinstance(envelope.content, bytes) else envelope.original_content or b""
        parsed = message_from_bytes(content, policy=policy.default)
        async with self.engine.begin() as conn:
            received = insert(messages).values(
                message_id=parsed.get("Message-ID"),
                mail_from=envelope.mail_from or "",
                rcpt_to=json.dumps(list(envelope.rcpt_tos)),
                subject=parsed.get("Subject"),
                idempotency_key=parsed.get(IDEMPOTENCY_HEADER),
                size_bytes=len(content),
                received_at_ms=db_now_ms(conn.dialect.name),
            )
            row_id = (await conn.execute(received.returning(messages.c.id))).scalar_one()
        return f"250 OK: queued as {row_id}"


class LookupSMTP(SMTP):
    """The SMTP protocol plus ``XLOOKUP <Message-ID>``: whether the server took that message."""

    async def smtp_XLOOKUP(self, arg: str) -> None:
        message_id = arg.strip()
        if not message_id:
            await self.push(f"501 Syntax: {LOOKUP_COMMAND} <Message-ID>")
            return
        handler = self.event_handler
        assert isinstance(handler, RecordingHandler)
        if not handler.answers_lookups:
            await self.push(f"502 5.5.1 {LOOKUP_COMMAND} not implemented")
            return
        first = select(messages.c.id, messages.c.received_at_ms).where(messages.c.message_id == message_id)
        async with handler.engine.connect() as conn:
            row = (await conn.execute(first.order_by(messages.c.id).limit(1))).first()
        if row is None:
            await self.push("550 not found")
        else:
            await self.push(f"250 found: queued as {row.id} at {row.received_at_ms}")


async def create_tables(engine: AsyncEngine) -> None:
    """Create ``messages`` if it does not exist (safe to run again)."""
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)


async def received_messages(url: str) -> list[ReceivedMessage]:
    """Every message the server recorded in ``url``, oldest first."""
    engine = create_async_database_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(select(messages).order_by(messages.c.id))
            return [ReceivedMessage.from_row(row) for row in rows]
    finally:
        await engine.dispose()


@asynccontextmanager
async def running_mail(
    url: str, *, handler: type[RecordingHandler] = RecordingHandler
) -> AsyncIterator[tuple[str, int]]:
    """Serve the recording SMTP server on a loopback port, recording into ``url`` with ``handler`` (a test's may
    hold its replies), until the block exits; yields ``(host, port)``."""
    engine = create_async_database_engine(url, pool_size=1)
    try:
        await create_tables(engine)
        recording = handler(engine)
        loop = asyncio.get_running_loop()
        sock = bind_loopback()
        server = await loop.create_server(lambda: LookupSMTP(recording, hostname="localhost", loop=loop), sock=sock)
        try:
            host, port = sock.getsockname()[:2]
            yield host, port
        finally:
            server.close()
            await server.wait_closed()
    finally:
        await engine.dispose()
