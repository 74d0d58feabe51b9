"""Tools of the operator console's browser test over real workers (:mod:`tests.acceptance.test_ui_real_stack`).

Worker processes load them with ``AGENTLEASE_TOOL_MODULES=tests.acceptance.ui_stack_tools``.

- ``ui_write_note`` (fenced): generation 1 enters ``external_call`` and holds there, renewing every
  0.5 s, until ``resume_file`` exists; the test pauses its worker meanwhile (SIGSTOP) and another worker
  takes over. It keeps holding through refused renewals (a paused worker learns nothing) and is deaf to
  Temporal's cancellation; once resumed and released it renews once more (refused: ``lease_lost``) and
  returns its result (the settle is refused: ``late_unapplied``). Any later generation just settles.
- ``ui_send_wire`` (unsafe, so it waits for an operator's approval): settles once approved.
- ``ui_send_mail`` (idempotent): fails permanently, so its task is dead-lettered.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, Field

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import LeaseLostError, PermanentToolError
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool

NOTE_TTL = timedelta(seconds=5)
"""The note's lease: generation 2 renews at every stage and settles within it, even on a loaded machine."""

HOLDING = "holding before the write"
"""Start of the renewal reason of the held generation 1 (the test waits for it in the ledger)."""


class NoteArgs(BaseModel):
    target: str = Field(min_length=1, max_length=200)
    resume_file: str


class WireArgs(BaseModel):
    account: str = Field(min_length=1, max_length=200)
    amount: int = 1


class MailArgs(BaseModel):
    to: str = Field(min_length=1, max_length=200)


async def _hold(ctx: LeaseContext, resume: Path) -> None:
    """Renew in ``external_call`` until ``resume`` exists, whatever the ledger or Temporal answer."""
    while not resume.exists():
        with contextlib.suppress(LeaseLostError, asyncio.CancelledError):
            await ctx.renew(f"{HOLDING} as generation {ctx.fencing_token}")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.5)


async def _late(ctx: LeaseContext, args: NoteArgs) -> ToolResult:
    """The resumed generation 1: one more renewal (refused) and its result (its settle refused)."""
    await _hold(ctx, Path(args.resume_file))
    with contextlib.suppress(LeaseLostError):
        await ctx.renew(f"writing {args.target} after the pause as generation {ctx.fencing_token}")
    return ToolResult(receipt=ctx.receipt("notes", args.target, "written", claim_generation=ctx.fencing_token))


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=NOTE_TTL, start_to_close=timedelta(minutes=3))
async def ui_write_note(ctx: LeaseContext, args: NoteArgs) -> ToolResult:
    """Write a note; generation 1 holds before its write until the test resumes it."""
    await ctx.advance(Stage.PREFLIGHT, f"checking {args.target}")
    await ctx.advance(Stage.EXTERNAL_CALL, f"writing {args.target} as generation {ctx.fencing_token}")
    if ctx.fencing_token == 1:
        late = asyncio.ensure_future(_late(ctx, args))
        while True:  # deaf to Temporal's cancellation of this attempt, as a paused worker is
            try:
                return await asyncio.shield(late)
            except asyncio.CancelledError:
                continue
    await ctx.advance(Stage.COMMIT, f"{args.target} written as generation {ctx.fencing_token}")
    await ctx.advance(Stage.VERIFY, f"reading {args.target} back")
    return ToolResult(receipt=ctx.receipt("notes", args.target, "written", claim_generation=ctx.fencing_token))


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=20))
async def ui_send_wire(ctx: LeaseContext, args: WireArgs) -> ToolResult:
    """Send a wire transfer: unsafe, so every call waits for an operator's approval first."""
    await ctx.advance(Stage.PREFLIGHT, f"checking account {args.account}")
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending {args.amount} to {args.account}")
    return ToolResult(receipt=ctx.receipt("wires", args.account, "sent"))


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=20))
async def ui_send_mail(ctx: LeaseContext, args: MailArgs) -> ToolResult:
    """Send a mail to a mailbox that does not exist: a permanent failure."""
    await ctx.advance(Stage.PREFLIGHT, f"looking up {args.to}")
    raise PermanentToolError(f"mailbox {args.to} does not exist")
