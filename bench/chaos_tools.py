"""Tools of the chaos run (``bench/chaos.py``): one per side-effect class that changes the world, writing to
the downstream of :mod:`tests.acceptance.matrix_downstream`, which counts every write it accepts.

Workers load them with ``AGENTLEASE_TOOL_MODULES=bench.chaos_tools``. Each call does what a careful
tool does (``docs/writing-tools.md``): it records each stage before its work, renews while it works
(``work_s`` seconds in ``external_call``, so that faults land mid-call), reads back first when an earlier
attempt reached ``commit``, lets ``LeaseLostError`` and ``LedgerUnavailableError`` propagate, and
settles with a receipt from a readback.

================  ==========================================================================================
``chaos_idempotent``  POST ``/api/documents/<target>`` with the task's ``Idempotency-Key``: a repeat is replayed
``chaos_fenced``      the same with ``Fencing-Token: <generation>``: a superseded attempt's write is refused (409)
``chaos_unsafe``      POST ``/plain/messages/<target>``: neither key nor fence; never retried past
                      ``external_call`` (G7), so an interrupted send waits for a person
================  ==========================================================================================

Every request carries ``X-Writer: <owner>#g<generation>`` so that the run can tell, from the downstream's
own records, which generation each accepted write came from.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
from pydantic import BaseModel, Field

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import RetryableToolError, raise_for_status
from agentlease.idempotency import FENCING_TOKEN_HEADER, REPLAYED_HEADER
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from tests.acceptance.matrix_downstream import WRITER_HEADER

LEASE_TTL = timedelta(seconds=5)
"""Lease TTL (= heartbeat timeout) of every chaos tool."""

RENEW_EVERY_S = 0.5
"""How often a tool renews while it works."""


class ChaosArgs(BaseModel):
    """``base_url`` of the downstream, the ``target`` this step writes, ``work_s`` spent in ``external_call``."""

    base_url: str
    target: str = Field(min_length=1, max_length=200)
    work_s: float = Field(default=1.0, ge=0, le=60)


async def _work(ctx: LeaseContext, seconds: float, doing: str) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until:
        await asyncio.sleep(min(RENEW_EVERY_S, max(0.0, until - loop.time())))
        await ctx.renew(doing)


def _transport(exc: httpx.TransportError, what: str) -> RetryableToolError:
    return RetryableToolError(f"{what}: {type(exc).__name__}")


async def _read_back(http: httpx.AsyncClient, path: str) -> dict[str, Any] | None:
    try:
        response = await http.get(path)
    except httpx.TransportError as exc:
        raise _transport(exc, f"GET {path}") from None
    if response.status_code == 404:
        return None
    raise_for_status(response, f"GET {path}")
    found: dict[str, Any] = response.json()
    return None if found.get("count") == 0 else found


async def _call(ctx: LeaseContext, args: ChaosArgs, *, path: str, fenced: bool, keyed: bool) -> ToolResult:
    writer = {WRITER_HEADER: f"{ctx.worker_identity}#g{ctx.fencing_token}"}
    body = json.dumps({"action": ctx.idempotency_key}, sort_keys=True).encode()
    async with httpx.AsyncClient(base_url=args.base_url, timeout=10.0, verify=False) as http:
        await ctx.advance(Stage.PREFLIGHT, f"checking {args.target}")
        found = await _read_back(http, path) if ctx.recovery.read_back_first else None
        answer: dict[str, Any] = {"wrote": False}
        if found is None:
            await ctx.advance(Stage.EXTERNAL_CALL, f"writing {args.target} as generation {ctx.fencing_token}")
            await _work(ctx, args.work_s, f"writing {args.target}")
            headers = {**writer}
            if keyed:
                headers.update(ctx.downstream_headers(resource=f"documents/{args.target}" if fenced else None))
                if not fenced:
                    headers.pop(FENCING_TOKEN_HEADER, None)
            try:
                response = await http.post(path, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise _transport(exc, f"POST {path}") from None
            stale = response.status_code == 409 and response.json().get("error") == "stale_fencing_token"
            if not stale:  # a newer generation wrote: the readback shows its write
                raise_for_status(response, f"POST {path}")
            answer = {"wrote": not stale, "replayed": response.headers.get(REPLAYED_HEADER) == "true"}
            await ctx.advance(Stage.COMMIT, f"{args.target} answered {response.status_code}")
        await ctx.advance(Stage.VERIFY, f"reading {args.target} back")
        found = await _read_back(http, path)
    if found is None:
        raise RetryableToolError(f"readback of {args.target} found nothing")
    return ToolResult(
        receipt=ctx.receipt("chaos-downstream", args.target, "present", generation=ctx.fencing_token),
        output={**answer, "recovery": ctx.recovery.action.value},
    )


_DECLARATION: dict[str, Any] = {"lease_ttl": LEASE_TTL, "start_to_close": timedelta(minutes=5), "max_attempts": 50}


@tool(side_effect=SideEffectClass.IDEMPOTENT, **_DECLARATION)
async def chaos_idempotent(ctx: LeaseContext, args: ChaosArgs) -> ToolResult:
    """Publishes the document ``args.target`` under the task's idempotency key."""
    return await _call(ctx, args, path=f"api/documents/{args.target}", fenced=False, keyed=True)


@tool(side_effect=SideEffectClass.FENCED, **_DECLARATION)
async def chaos_fenced(ctx: LeaseContext, args: ChaosArgs) -> ToolResult:
    """Publishes the document ``args.target`` with the claim generation as fencing token."""
    return await _call(ctx, args, path=f"api/documents/{args.target}", fenced=True, keyed=True)


@tool(side_effect=SideEffectClass.UNSAFE, requires_approval=False, **_DECLARATION)
async def chaos_unsafe(ctx: LeaseContext, args: ChaosArgs) -> ToolResult:
    """Sends a message to ``args.target``: no key, no fence."""
    return await _call(ctx, args, path=f"plain/messages/{args.target}", fenced=False, keyed=False)


CHAOS_TOOLS = ("chaos_idempotent", "chaos_fenced", "chaos_unsafe")
"""The tools of one chaos run, one step each."""
