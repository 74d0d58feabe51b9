"""``smtp_send``: one e-mail over SMTP, the classic ``unsafe`` side effect (no key, no readback: G7 applies); its
probe (:func:`delivered`) asks the server by ``Message-ID`` (``docs/plans.md``, "Built-in tools").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import smtplib
from datetime import timedelta
from email.message import EmailMessage
from email.utils import formatdate

from pydantic import BaseModel, Field

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import AmbiguousSideEffectError, PermanentToolError, RetryableToolError
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools._probe import ProbeQuery, ProbeResult

IDEMPOTENCY_HEADER = "X-Idempotency-Key"
"""Header carrying the task's idempotency key in every message (SMTP itself ignores it)."""

MESSAGE_ID_DOMAIN = "agentlease.invalid"
"""Right-hand side of the ``Message-ID`` the tool makes."""

LOOKUP_COMMAND = "XLOOKUP"
"""The command a server that can be asked takes: ``XLOOKUP <Message-ID>`` -> 250 found / 550 not found."""

_ADDRESS = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


class SmtpSendArgs(BaseModel):
    """Arguments of ``smtp_send``.

    Attributes:
        to: 1 to 50 recipient addresses (``local@domain``).
        subject: the subject line.
        body: the plain-text body.
        sender: the envelope and ``From`` address. Default ``agentlease@localhost``.
        timeout_s: timeout of each SMTP command, in seconds. Default 10.
    """

    to: list[str] = Field(min_length=1, max_length=50)
    subject: str = Field(min_length=1, max_length=500)
    body: str = Field(max_length=100_000)
    sender: str = "agentlease@localhost"
    timeout_s: float = Field(default=10.0, gt=0)


def message_id_for(idempotency_key: str) -> str:
    """``<sha256(key)[:40]@agentlease.invalid>``: one Message-ID per logical action."""
    return f"<{hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]}@{MESSAGE_ID_DOMAIN}>"


def _build(args: SmtpSendArgs, idempotency_key: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = args.sender
    message["To"] = ", ".join(args.to)
    message["Subject"] = args.subject
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = message_id_for(idempotency_key)
    message[IDEMPOTENCY_HEADER] = idempotency_key
    message.set_content(args.body)
    return message


def _reply(code: int, text: bytes) -> str:
    return f"{code} {text.decode('utf-8', 'replace')}"


def _check_reply(command: str, code: int, text: bytes, accepted: tuple[int, ...] = (250,)) -> None:
    if code in accepted:
        return
    if 400 <= code < 500:
        raise RetryableToolError(f"{command} refused for now: {_reply(code, text)}")
    raise PermanentToolError(f"{command} refused: {_reply(code, text)}")


def _open(host: str, port: int, args: SmtpSendArgs) -> smtplib.SMTP:
    """Connect and pass the envelope (MAIL FROM, RCPT TO): nothing is delivered yet."""
    try:
        smtp = smtplib.SMTP(host, port, timeout=args.timeout_s)
    except (OSError, smtplib.SMTPException) as exc:
        raise RetryableToolError(f"cannot reach SMTP server {host}:{port}: {type(exc).__name__}") from None
    try:
        smtp.ehlo_or_helo_if_needed()
        _check_reply("MAIL FROM", *smtp.mail(args.sender))
        for address in args.to:
            _check_reply(f"RCPT TO {address}", *smtp.rcpt(address), accepted=(250, 251))
    except (OSError, smtplib.SMTPException) as exc:
        smtp.close()
        raise RetryableToolError(f"SMTP envelope to {host}:{port}: {type(exc).__name__}") from None
    except BaseException:
        smtp.close()
        raise
    return smtp


def _deliver(smtp: smtplib.SMTP, message: EmailMessage) -> str:
    """``DATA``: the step that delivers; closes the connection. Returns the server's reply."""
    try:
        code, text = smtp.data(message.as_bytes())
    except (OSError, smtplib.SMTPException) as exc:
        smtp.close()
        raise AmbiguousSideEffectError(f"DATA failed: {type(exc).__name__}: {exc}") from None
    try:
        with contextlib.suppress(OSError, smtplib.SMTPException):  # the reply is in; a failed QUIT changes nothing
            smtp.quit()
    finally:
        smtp.close()
    if code != 250:
        # Refused after the data went out: most likely not delivered, but only a person can be sure.
        raise AmbiguousSideEffectError(f"DATA answered {_reply(code, text)}")
    return _reply(code, text)


def _lookup(host: str, port: int, message_id: str, timeout_s: float) -> tuple[int, str]:
    """``XLOOKUP <message_id>`` on the server: its reply code and text."""
    smtp = smtplib.SMTP(host, port, timeout=timeout_s)
    try:
        smtp.ehlo_or_helo_if_needed()
        code, text = smtp.docmd(LOOKUP_COMMAND, message_id)
        with contextlib.suppress(OSError, smtplib.SMTPException):
            smtp.quit()
        return code, text.decode("utf-8", "replace")
    finally:
        smtp.close()


async def delivered(query: ProbeQuery) -> ProbeResult:
    """``smtp_send``'s probe: ``XLOOKUP <Message-ID>``. ``happened`` with a receipt like the tool's (``accepted``),
    ``not_happened`` on ``550``, ``cannot_tell`` when the server cannot be reached or does not know the command."""
    settings = query.settings
    host, port = (settings.smtp_host, settings.smtp_port) if settings is not None else (None, 25)
    if not host:
        return ProbeResult.cannot_tell("no AGENTLEASE_SMTP_HOST to ask")
    args = query.arguments
    assert isinstance(args, SmtpSendArgs)
    message_id = message_id_for(query.idempotency_key)
    asked = f"{LOOKUP_COMMAND} {message_id} at {host}:{port}"
    try:
        code, text = await asyncio.to_thread(_lookup, host, port, message_id, args.timeout_s)
    except (OSError, smtplib.SMTPException) as exc:
        return ProbeResult.cannot_tell(f"{asked}: {type(exc).__name__}")
    if code == 550:
        return ProbeResult.not_happened(asked=asked, reply=_reply(code, text.encode()))
    if code != 250:
        return ProbeResult.cannot_tell(f"{asked}: the server answered {code} {text}")
    receipt = query.receipt(
        "smtp",
        message_id,
        "accepted",
        server=f"{host}:{port}",
        reply=f"{code} {text}",
        recipients=args.to,
        idempotency_key=query.idempotency_key,
        found_by=LOOKUP_COMMAND,
    )
    return ProbeResult.happened(receipt, asked=asked, reply=f"{code} {text}")


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=timedelta(seconds=15),
    start_to_close=timedelta(minutes=2),
    probe=delivered,
)
async def smtp_send(ctx: LeaseContext, args: SmtpSendArgs) -> ToolResult:
    """Send one message; never retried past ``external_call`` without a reconciliation decision."""
    host, port = ctx.settings.smtp_host, ctx.settings.smtp_port
    if not host:
        raise PermanentToolError("smtp_send needs AGENTLEASE_SMTP_HOST")
    await ctx.advance(Stage.PREFLIGHT, f"checking {len(args.to)} recipient(s) and the envelope via {host}:{port}")
    bad = [address for address in [args.sender, *args.to] if not _ADDRESS.match(address)]
    if bad:
        raise PermanentToolError(f"not an e-mail address: {', '.join(bad)}")
    message = _build(args, ctx.idempotency_key)
    smtp = await asyncio.to_thread(_open, host, port, args)
    try:
        await ctx.advance(Stage.EXTERNAL_CALL, f"sending {message['Message-ID']} to {', '.join(args.to)}")
    except BaseException:
        smtp.close()
        raise
    reply = await asyncio.to_thread(_deliver, smtp, message)
    await ctx.advance(Stage.COMMIT, f"server accepted {message['Message-ID']}: {reply}")
    await ctx.advance(Stage.VERIFY, "SMTP has no readback: the receipt records the server's reply")
    receipt = ctx.receipt(
        "smtp",
        message["Message-ID"],
        "accepted",
        server=f"{host}:{port}",
        reply=reply,
        recipients=args.to,
        idempotency_key=ctx.idempotency_key,
    )
    return ToolResult(receipt=receipt, output={"message_id": message["Message-ID"], "reply": reply})
