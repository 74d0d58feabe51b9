"""Tools of the pause/kill matrix, one per side-effect class, all running the same code.

Worker processes load them with ``AGENTLEASE_TOOL_MODULES=tests.acceptance.matrix_tools`` (the
repository on ``PYTHONPATH``). Every run tells its tool what to do through the plan's arguments
(:class:`MatrixArgs`), so one worker process can serve many cases of the matrix at once.

What each stage does, against the downstream of :mod:`tests.acceptance.matrix_downstream`:

================  ==============================================================================
preflight         nothing external
external_call     the write: ``idempotent`` POSTs the document with the task's idempotency key;
                  ``fenced`` POSTs it with ``Fencing-Token: <generation>`` and a key per attempt
                  (``<key>#g<generation>``), so that the fence, not the key, must stop an older
                  attempt; ``unsafe`` POSTs a message with neither; ``read_only`` GETs the catalog
commit            nothing more: the downstream committed the write before it answered
verify            the readback that makes the settlement receipt
================  ==============================================================================

A later attempt whose recovery decision is ``read_back_first`` or ``retry_readback`` reads back
first and writes only when the target is missing (G6). The request body is the same bytes in
every attempt, so a repeated idempotent write is a replay, not a 422.

The attempt of generation 1 may be stopped on purpose:

- ``hold_at``: right after the ledger recorded that stage, it renews every 0.5 s until
  ``resume_file`` exists, so the test can SIGSTOP or SIGKILL its worker there. After the hold it
  carries on from the next instruction, as a process resumed after SIGSTOP does: a write that
  followed the hold point is sent without another lease check.
- ``stall_s``: after preflight it stops renewing and keeps working that long (the short lease).

When a renewal is refused (the lease was lost), the ``unsafe`` tool stops, as every tool must: it
has no other guard. The other classes record the refusal and carry on, so that what stops their
late write is the downstream's guard (the fence, the key), not the tool's good manners; the
runtime still refuses their settle (``late_unapplied``). Generation 1 also ignores the
cancellation Temporal delivers once it learns the attempt timed out: a paused worker notices
nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, Field

from agentlease.enums import RecoveryAction, SideEffectClass, Stage
from agentlease.errors import LeaseLostError, RetryableToolError
from agentlease.idempotency import FENCING_TOKEN_HEADER, IDEMPOTENCY_KEY_HEADER, REPLAYED_HEADER
from agentlease.records import SettlementReceipt
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from tests.acceptance.matrix_downstream import WRITER_HEADER

LEASE_TTL = timedelta(seconds=2)
"""Lease TTL (= heartbeat timeout) of every matrix tool."""

HOLD_RENEW_INTERVAL_S = 0.5
"""How often a held attempt renews its lease (TTL / 4) while it waits to be paused or killed."""

HOLDING = "holding at"
"""Start of the renewal reason of a held attempt (the test waits for it in the ledger)."""

READ_BACK_ACTIONS = frozenset({RecoveryAction.READ_BACK_FIRST, RecoveryAction.RETRY_READBACK})

T = TypeVar("T")


class MatrixArgs(BaseModel):
    """Per-run instructions.

    Attributes:
        base_url: the downstream's base URL.
        target: the document (or message recipient) this run writes; unique per run.
        hold_at: stage where generation 1 holds until ``resume_file`` exists.
        resume_file: path whose existence ends the hold.
        stall_s: seconds generation 1 keeps working after preflight without renewing.
    """

    base_url: str
    target: str = Field(min_length=1, max_length=200)
    hold_at: Stage | None = None
    resume_file: str | None = None
    stall_s: float | None = Field(default=None, gt=0)


class _Attempt:
    """One attempt of a matrix tool."""

    def __init__(self, ctx: LeaseContext, args: MatrixArgs, http: httpx.AsyncClient) -> None:
        self.ctx = ctx
        self.args = args
        self.http = http
        self.cls = ctx.side_effect_class
        self.first = ctx.fencing_token == 1
        self.refused: list[str] = []
        self.answers: list[dict[str, Any]] = []

    async def step(self, stage: Stage, reason: str) -> None:
        """Enter ``stage``; a refused renewal stops an unsafe tool and is recorded by the others."""
        try:
            await self.ctx.advance(stage, reason)
        except LeaseLostError:
            if self.cls is SideEffectClass.UNSAFE:
                raise
            self.refused.append(stage.value)
        if self.first and self.args.hold_at is stage:
            await self.hold()

    async def hold(self) -> None:
        resume = Path(self.args.resume_file or "/nonexistent/never")
        while not resume.exists():
            try:
                await self.ctx.renew(f"{HOLDING} {self.ctx.stage} until the test pauses or kills this worker")
            except LeaseLostError:
                return  # The renewal under way when the process stopped was refused after it resumed.
            await asyncio.sleep(HOLD_RENEW_INTERVAL_S)

    async def run(self) -> ToolResult:
        target = self.args.target
        await self.step(Stage.PREFLIGHT, f"checking {target}")
        if self.first and self.args.stall_s:
            await asyncio.sleep(self.args.stall_s)  # Working without renewing: the lease lapses meanwhile.
        found = None
        if self.cls is not SideEffectClass.READ_ONLY and self.ctx.recovery.action in READ_BACK_ACTIONS:
            found = await self.read_back()
        wrote = False
        if found is None:
            await self.step(Stage.EXTERNAL_CALL, f"{self.verb} {target}")
            self.answers.append(await self.write())
            wrote = self.cls is not SideEffectClass.READ_ONLY
            await self.step(Stage.COMMIT, f"{target} answered {self.answers[-1]['status']}")
        await self.step(Stage.VERIFY, f"reading {target} back")
        found = await self.read_back()
        if found is None:
            raise RetryableToolError(f"readback of {target} found nothing")
        details = {
            "generation": self.ctx.fencing_token,
            "owner": self.ctx.worker_identity,
            "recovery": self.ctx.recovery.action.value,
            "wrote": wrote,
            "found": found,
        }
        receipt = SettlementReceipt(
            external_system="matrix-downstream",
            external_id=target,
            status="present",
            details=details,
            verified_at=datetime.now(UTC),
        )
        return ToolResult(receipt=receipt, output={**details, "answers": self.answers, "refused": self.refused})

    @property
    def verb(self) -> str:
        return "reading" if self.cls is SideEffectClass.READ_ONLY else "writing"

    def _body(self) -> bytes:
        # The same bytes in every attempt: a repeated key is a replay, never a 422.
        return json.dumps({"action": self.ctx.idempotency_key}, sort_keys=True).encode()

    async def write(self) -> dict[str, Any]:
        ctx, target = self.ctx, self.args.target
        writer = {WRITER_HEADER: f"{ctx.worker_identity}#g{ctx.fencing_token}"}
        try:
            if self.cls is SideEffectClass.READ_ONLY:
                response = await self.http.get(f"api/catalog/{target}", headers=writer)
            elif self.cls is SideEffectClass.IDEMPOTENT:
                headers = {IDEMPOTENCY_KEY_HEADER: ctx.idempotency_key, **writer}
                response = await self.http.post(f"api/documents/{target}", content=self._body(), headers=headers)
            elif self.cls is SideEffectClass.FENCED:
                headers = {
                    IDEMPOTENCY_KEY_HEADER: f"{ctx.idempotency_key}#g{ctx.fencing_token}",
                    FENCING_TOKEN_HEADER: str(ctx.fencing_token),
                    **writer,
                }
                response = await self.http.post(f"api/documents/{target}", content=self._body(), headers=headers)
            else:
                response = await self.http.post(f"plain/messages/{target}", content=self._body(), headers=writer)
        except httpx.TransportError as exc:
            raise RetryableToolError(f"{self.verb} {target}: {type(exc).__name__}") from None
        answer = {"status": response.status_code, "replayed": response.headers.get(REPLAYED_HEADER) == "true"}
        if response.status_code == 409 and response.json().get("error") == "stale_fencing_token":
            return {**answer, "error": "stale_fencing_token"}  # A newer generation wrote: the readback shows it.
        if response.status_code >= 400:
            raise RetryableToolError(f"{self.verb} {target}: HTTP {response.status_code}")
        return answer

    async def read_back(self) -> dict[str, Any] | None:
        target = self.args.target
        path = {SideEffectClass.READ_ONLY: "api/catalog", SideEffectClass.UNSAFE: "plain/messages"}.get(
            self.cls, "api/documents"
        )
        for tries_left in (1, 0):  # a read: asked again once on a connection the server closed during a pause
            try:
                response = await self.http.get(f"{path}/{target}")
                break
            except httpx.RemoteProtocolError:
                if not tries_left:
                    raise RetryableToolError(f"reading {target} back: RemoteProtocolError") from None
            except httpx.TransportError as exc:
                raise RetryableToolError(f"reading {target} back: {type(exc).__name__}") from None
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise RetryableToolError(f"reading {target} back: HTTP {response.status_code}")
        found: dict[str, Any] = response.json()
        if self.cls is SideEffectClass.UNSAFE and found["count"] == 0:
            return None
        if "action" in found and found["action"] != self.ctx.idempotency_key:
            raise RetryableToolError(f"{target} holds another action's document")
        return found


async def _despite_cancellation(work: Awaitable[T]) -> T:
    """Await ``work`` to its end, absorbing cancellation of the caller (a paused worker notices nothing)."""
    task = asyncio.ensure_future(work)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()


async def matrix_attempt(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """One attempt of a matrix tool (see the module docstring); generation 1 ignores cancellation."""

    async def attempt() -> ToolResult:
        # No TLS on loopback: skip loading a CA bundle in every attempt, before the first renewal.
        async with httpx.AsyncClient(base_url=args.base_url, timeout=10.0, verify=False) as http:
            return await _Attempt(ctx, args, http).run()

    if ctx.fencing_token == 1:
        return await _despite_cancellation(attempt())
    return await attempt()


_DECLARATION: dict[str, Any] = {"lease_ttl": LEASE_TTL, "start_to_close": timedelta(minutes=2)}


@tool(side_effect=SideEffectClass.READ_ONLY, **_DECLARATION)
async def matrix_read_only(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Reads the catalog entry of ``args.target``."""
    return await matrix_attempt(ctx, args)


@tool(side_effect=SideEffectClass.IDEMPOTENT, **_DECLARATION)
async def matrix_idempotent(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Publishes ``args.target`` under the task's idempotency key."""
    return await matrix_attempt(ctx, args)


@tool(side_effect=SideEffectClass.FENCED, **_DECLARATION)
async def matrix_fenced(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Publishes ``args.target`` with the claim generation as fencing token."""
    return await matrix_attempt(ctx, args)


@tool(side_effect=SideEffectClass.UNSAFE, **_DECLARATION)
async def matrix_unsafe(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Sends a message to ``args.target``: no key, no fence."""
    return await matrix_attempt(ctx, args)
