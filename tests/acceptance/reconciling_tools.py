"""Tools of the reconciliation, cancel and heartbeat-timeout tests (issue 18), loaded by worker processes with
``AGENTLEASE_TOOL_MODULES=tests.acceptance.reconciling_tools``.

Their downstream is the pause/kill matrix's HTTP server (:mod:`tests.acceptance.matrix_downstream`), whose
``/plain/messages/<target>`` counts every message it is sent (no key, no fence: an ``unsafe`` effect):

- ``probed_send``: the matrix's ``unsafe`` tool (generation 1 holds at ``hold_at`` until the test kills its
  worker) with a readback probe that asks the downstream how many messages ``target`` received;
- ``blind_send``: the same, with a probe that cannot tell (the downstream keeps no record it could ask);
- ``lagging_send``: the same as ``probed_send`` against a downstream that shows its probe a message
  ``lag_ms`` late, with a settle window; or generation 1 loses the answer to its write and probes at once;
- ``conflicted_send``: the same, whose probe finds the key held for a message with other arguments;
- ``chatty_send``: in ``external_call`` it sends one message every 0.3 s, renewing, until it is stopped (a
  cancelled run's call must stop before the run reports cancelled);
- ``slow_renewer``: renews every second, ``seconds`` times, with a 10 s lease, then settles (a heartbeat
  timeout changed under it with ``temporal activity update-options``); before each renewal it may write one
  record to the downstream (``base_url``: one message to ``target``, so a rewrite shows in the count) and
  wait for the test to let it go on (``gate_dir``: renewal ``n`` waits for the file ``<gate_dir>/<n>``).
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, Field

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import AmbiguousSideEffectError, RetryableToolError
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools._probe import ProbeQuery, ProbeResult
from tests.acceptance.matrix_downstream import WRITER_HEADER
from tests.acceptance.matrix_tools import MatrixArgs, matrix_attempt

LEASE_TTL = timedelta(seconds=6)
"""Lease TTL of the probed tools: generation 1 renews every 0.5 s while it holds."""

CHATTY_INTERVAL_S = 0.3
"""How often ``chatty_send`` sends while it runs."""

CHATTY = "sending message"
"""Start of ``chatty_send``'s renewal reasons."""


async def messages_received(query: ProbeQuery) -> ProbeResult:
    """Probe of ``probed_send`` and ``lagging_send``: the downstream's count of messages to ``target`` (shown
    ``lag_ms`` late for ``lagging_send``)."""
    args = query.arguments
    assert isinstance(args, MatrixArgs)
    lag = {"lag_ms": args.lag_ms} if isinstance(args, LaggingArgs) else {}
    async with httpx.AsyncClient(base_url=args.base_url, timeout=5.0) as http:
        response = await http.get(f"plain/messages/{args.target}", params=lag)
    if response.status_code != 200:
        return ProbeResult.cannot_tell(f"GET plain/messages/{args.target}: HTTP {response.status_code}")
    count = response.json()["count"]
    if count == 0:
        return ProbeResult.not_happened(messages=0)
    receipt = query.receipt("matrix-downstream", args.target, "delivered", messages=count, by="probe")
    return ProbeResult.happened(receipt, messages=count)


async def no_record(query: ProbeQuery) -> ProbeResult:
    """Probe of ``blind_send``: the downstream cannot be asked."""
    return ProbeResult.cannot_tell("the downstream keeps no record of messages it could be asked about")


_UNSAFE: dict[str, Any] = {
    "side_effect": SideEffectClass.UNSAFE,
    "lease_ttl": LEASE_TTL,
    "start_to_close": timedelta(minutes=2),
    "requires_approval": False,
}


@tool(**_UNSAFE, probe=messages_received)
async def probed_send(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Sends a message to ``args.target``: no key, no fence; a probe can count what arrived."""
    return await matrix_attempt(ctx, args)


@tool(**_UNSAFE, probe=no_record)
async def blind_send(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Sends a message to ``args.target``: no key, no fence; its probe cannot tell."""
    return await matrix_attempt(ctx, args)


class LaggingArgs(MatrixArgs):
    """``lagging_send``'s run: its probe is shown a message ``lag_ms`` after the downstream accepted it; with
    ``drop_answer`` generation 1 loses the downstream's answer to its write (the same attempt asks the probe)."""

    lag_ms: int = Field(default=0, ge=0)
    drop_answer: bool = False


LAGGING_TTL = timedelta(seconds=2)
"""Lease TTL of ``lagging_send``: the next attempt after a kill probes about 4 s after the write."""

SETTLE_WINDOW = timedelta(seconds=10)
"""How late ``lagging_send`` declares its downstream may show a write; the tests' lags are at most this."""


async def sent_or_lost(ctx: LeaseContext, args: LaggingArgs) -> ToolResult:
    """The matrix's attempt; with ``drop_answer`` generation 1 sends, then loses the answer."""
    if args.drop_answer and ctx.fencing_token == 1:
        await ctx.advance(Stage.EXTERNAL_CALL, f"sending a message to {args.target}")
        headers = {WRITER_HEADER: f"{ctx.worker_identity}#g{ctx.fencing_token}"}
        body = json.dumps({"action": ctx.idempotency_key}, sort_keys=True).encode()
        async with httpx.AsyncClient(base_url=args.base_url, timeout=5.0) as http:
            await http.post(f"plain/messages/{args.target}", content=body, headers=headers)
        raise AmbiguousSideEffectError("the connection dropped before the downstream's answer arrived")
    return await matrix_attempt(ctx, args)


@tool(**{**_UNSAFE, "lease_ttl": LAGGING_TTL}, probe=messages_received, settle_window=SETTLE_WINDOW)
async def lagging_send(ctx: LeaseContext, args: LaggingArgs) -> ToolResult:
    """Sends a message to ``args.target`` (no key, no fence), whose probe reads the downstream ``lag_ms`` late."""
    return await sent_or_lost(ctx, args)


HELD_FOR = {"target": "someone-else", "body_sha256": "0" * 64}
"""What ``conflicted_send``'s probe says the downstream holds under the key."""


async def held_for_other_arguments(query: ProbeQuery) -> ProbeResult:
    """Probe of ``conflicted_send``: the downstream holds the key for a message with other arguments."""
    return ProbeResult.conflict("the downstream holds this key for another message", held=HELD_FOR)


@tool(**{**_UNSAFE, "lease_ttl": LAGGING_TTL}, probe=held_for_other_arguments)
async def conflicted_send(ctx: LeaseContext, args: LaggingArgs) -> ToolResult:
    """As ``lagging_send``, but its probe finds the key used by another action."""
    return await sent_or_lost(ctx, args)


class ChattyArgs(BaseModel):
    """Where ``chatty_send`` sends: the downstream's base URL and the run's target."""

    base_url: str
    target: str = Field(min_length=1, max_length=200)


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=LEASE_TTL, requires_approval=False)
async def chatty_send(ctx: LeaseContext, args: ChattyArgs) -> ToolResult:
    """Sends message after message to ``target`` until it is stopped (it never settles by itself)."""
    await ctx.advance(Stage.PREFLIGHT, f"preparing messages to {args.target}")
    await ctx.advance(Stage.EXTERNAL_CALL, f"{CHATTY} 1 to {args.target}")
    body = json.dumps({"action": ctx.idempotency_key}).encode()
    headers = {WRITER_HEADER: f"{ctx.worker_identity}#g{ctx.fencing_token}"}
    async with httpx.AsyncClient(base_url=args.base_url, timeout=5.0) as http:
        sent = 0
        while True:
            response = await http.post(f"plain/messages/{args.target}", content=body, headers=headers)
            if response.status_code != 201:
                raise RetryableToolError(f"HTTP {response.status_code}")
            sent += 1
            await asyncio.sleep(CHATTY_INTERVAL_S)
            await ctx.renew(f"{CHATTY} {sent + 1} to {args.target}")


class RenewingArgs(BaseModel):
    """What ``slow_renewer`` does (module docstring)."""

    seconds: int = Field(gt=0, le=120)
    base_url: str | None = None
    target: str = Field(default="renewer", min_length=1, max_length=200)
    gate_dir: str | None = None


RENEWING_TTL = timedelta(seconds=10)

GATE_POLL_S = 0.05
"""How often ``slow_renewer`` looks for the file that lets its next renewal go."""


async def _opened(gate: Path) -> None:
    """Wait until the test creates ``gate``."""
    while True:
        if gate.exists():
            return
        await asyncio.sleep(GATE_POLL_S)


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=RENEWING_TTL, start_to_close=timedelta(minutes=3))
async def slow_renewer(ctx: LeaseContext, args: RenewingArgs) -> ToolResult:
    """Works ``seconds`` seconds in ``external_call``, renewing every second, then settles."""
    await ctx.advance(Stage.PREFLIGHT, "starting the work")
    await ctx.advance(Stage.EXTERNAL_CALL, "working")
    body = json.dumps({"action": ctx.idempotency_key}).encode()
    headers = {WRITER_HEADER: f"{ctx.worker_identity}#g{ctx.fencing_token}"}
    async with httpx.AsyncClient(base_url=args.base_url or "http://127.0.0.1", timeout=5.0) as http:
        for n in range(1, args.seconds + 1):
            await asyncio.sleep(1.0)
            if args.gate_dir is not None:
                await _opened(Path(args.gate_dir) / str(n))
            if args.base_url is not None:
                response = await http.post(f"plain/messages/{args.target}", content=body, headers=headers)
                if response.status_code != 201:
                    raise RetryableToolError(f"record {n}: HTTP {response.status_code}")
            await ctx.renew(f"working, second {n}")
    await ctx.advance(Stage.VERIFY, "done, reading back")
    return ToolResult(
        receipt=ctx.receipt("renewer", ctx.idempotency_key, "done", seconds=args.seconds, generation=ctx.fencing_token),
        output={"seconds": args.seconds, "generation": ctx.fencing_token, "attempts": ctx.claim.attempts},
    )
