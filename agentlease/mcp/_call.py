"""One leased MCP ``tools/call``: the attempt the worker runs for a tool declared by :func:`mcp_tools`
(``docs/mcp.md``, "One attempt")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND, CallToolResult, RequestParamsMeta
from pydantic import BaseModel

from agentlease.enums import Stage
from agentlease.errors import (
    AgentLeaseError,
    AmbiguousSideEffectError,
    EffectInDoubtError,
    KeyInFlightError,
    LeaseLostError,
    LedgerUnavailableError,
    PermanentToolError,
    RetryableToolError,
    one_line,
)
from agentlease.mcp._client import MCPServer, list_tools, session
from agentlease.mcp._convention import (
    EXTENSION,
    IDEMPOTENCY_KEY_META,
    REPLAYED_META,
    Refusal,
    default_resource,
    lease_meta,
    refusal_of,
)
from agentlease.mcp._policy import BINDING_ATTRIBUTE, MCPBinding, compare
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult

logger = logging.getLogger("agentlease.mcp")
_T = TypeVar("_T")

MAX_OUTPUT_CHARS = 16_000
"""Longest text output kept for the agent (it travels through Temporal history); longer is cut."""

_checked: dict[MCPServer, dict[str, dict[str, Any]]] = {}
"""Per server, the tools it listed at this process's first call (the per-process check)."""


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what anyio's task groups wrap."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


@asynccontextmanager
async def _connected(server: MCPServer) -> AsyncIterator[Client]:
    """A session of ``server``; a failure to connect is retryable (nothing was sent)."""
    entered = False
    try:
        async with session(server) as client:
            entered = True
            yield client
    except BaseException as exc:
        leaf = _leaf(exc)
        if entered or isinstance(leaf, asyncio.CancelledError):
            if leaf is not exc and isinstance(leaf, AgentLeaseError | asyncio.CancelledError):
                raise leaf from None  # the attempt's own outcome, wrapped by the session's task group
            raise
        raise RetryableToolError(f"cannot reach MCP server {server.name!r}: {one_line(leaf)}") from None


async def _check_listed(client: Client, binding: MCPBinding) -> None:
    """Once per process and server: the tool is listed with the declared arguments."""
    listed = _checked.get(binding.server)
    if listed is None:
        try:
            listed = _checked[binding.server] = await list_tools(client)
        except Exception as exc:  # noqa: BLE001 - nothing was sent yet
            raise RetryableToolError(f"tools/list of {binding.server.name!r} failed: {one_line(_leaf(exc))}") from None
    problems = compare(binding, listed)
    if problems:
        _checked.pop(binding.server, None)  # the server may be redeployed: list again next time
        raise PermanentToolError("; ".join(problems))


def _guard_settings(client: Client, tool: str) -> dict[str, Any] | None:
    """The server's ``io.agentlease/lease`` settings when it guards ``tool``, else ``None``."""
    settings = (client.server_capabilities.extensions or {}).get(EXTENSION)
    if not isinstance(settings, dict):
        return None
    tools = settings.get("tools")
    return settings if tools == "*" or (isinstance(tools, list) and tool in tools) else None


def _output(result: CallToolResult) -> dict[str, Any]:
    """What the agent reads: the structured content when it is an object, else the text content."""
    if isinstance(result.structured_content, dict) and not result.is_error:
        return dict(result.structured_content)
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{block.type} content]")
    text = "\n".join(parts)
    if len(text) > MAX_OUTPUT_CHARS:
        text = text[:MAX_OUTPUT_CHARS] + f"... ({len(text) - MAX_OUTPUT_CHARS} more characters)"
    output: dict[str, Any] = {"content": text}
    if result.is_error:
        output["is_error"] = True
    return output


def _failure(exc: BaseException, binding: MCPBinding, ctx: LeaseContext) -> Exception:
    """What an answer other than a result, or a lost connection, after sending means (``docs/mcp.md``)."""
    what = f"tools/call {binding.tool} on {binding.server.name!r}"
    if isinstance(exc, MCPError):
        refusal = refusal_of(exc.code, exc.data)
        if refusal is Refusal.STALE_TOKEN:
            return LeaseLostError(
                ctx.claim.task_id,
                ctx.fencing_token,
                operation=f"mcp {binding.tool}",
                current_generation=exc.data.get("current_generation"),
            )
        if refusal is Refusal.IN_FLIGHT:
            wait_ms = exc.data.get("retry_after_ms") if isinstance(exc.data, dict) else None
            retry_after = timedelta(
                milliseconds=wait_ms if isinstance(wait_ms, int) and 0 < wait_ms <= 60_000 else 1000
            )
            return KeyInFlightError(f"{what}: a call with this key is still running at the server", retry_after)
        if refusal is Refusal.IN_DOUBT:
            return EffectInDoubtError(f"{what}: the server holds this key in doubt ({exc.message})")
        if refusal is not None or exc.code in (INVALID_PARAMS, METHOD_NOT_FOUND):
            return PermanentToolError(f"{what} refused: {exc.message}")
        return AmbiguousSideEffectError(f"{what} answered error {exc.code}: {exc.message}")
    return AmbiguousSideEffectError(f"{what}: {one_line(exc)} after sending")


class _Waiting:
    """Renews the lease through the attempt, with the server's latest progress as the reason once it is sent."""

    def __init__(self, ctx: LeaseContext, binding: MCPBinding) -> None:
        self.ctx = ctx
        self.binding = binding
        ttl = ctx.claim.lease_ttl
        self.every = (binding.policy.renew_every or ttl / 3).total_seconds()
        self.started = time.monotonic()
        self.sent_at: float | None = None
        self.progress: str | None = None
        self.progress_at: float | None = None

    def sent(self) -> None:
        """``tools/call`` was sent: the reasons now say how long the server has been at it."""
        self.sent_at = time.monotonic()

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        amount = f"{progress:g}" + (f" of {total:g}" if total is not None else "")
        self.progress = f"{amount}" + (f" ({message[:200]})" if message else "")
        self.progress_at = time.monotonic()

    def reason(self) -> str:
        if self.sent_at is None:
            waited = time.monotonic() - self.started
            return f"talking to {self.binding.server.name} before calling {self.binding.tool} ({waited:.0f}s)"
        waited = time.monotonic() - self.sent_at
        head = f"awaiting {self.binding.tool} on {self.binding.server.name} ({waited:.0f}s)"
        if self.progress is None:
            return f"{head}, no progress reported"
        ago = time.monotonic() - (self.progress_at or self.sent_at)
        return f"{head}: progress {self.progress}, {ago:.0f}s ago"

    async def renewing(self) -> None:
        """Renew every ``self.every`` seconds until cancelled; a lost lease raises ``LeaseLostError``."""
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.ctx.renew(self.reason())
            except LedgerUnavailableError:
                continue  # the call is out already; the settle is guarded, try again next time


async def _while_renewing(work: Awaitable[_T], waiting: _Waiting) -> _T:
    """Await ``work`` in this task while another renews; a lost lease cancels it with ``LeaseLostError``."""
    waiter = asyncio.current_task()
    assert waiter is not None
    lost: list[LeaseLostError] = []

    async def renew() -> None:
        try:
            await waiting.renewing()
        except LeaseLostError as exc:
            lost.append(exc)
            waiter.cancel()

    renewer = asyncio.ensure_future(renew())
    try:
        return await work
    except asyncio.CancelledError:
        if lost and waiter.uncancel() == 0:
            raise lost[0] from None
        raise
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer


def _request_meta(entries: dict[str, str]) -> RequestParamsMeta:
    """The convention's entries as the SDK's ``_meta`` (an open map)."""
    meta: RequestParamsMeta = {}
    meta.update(entries)  # type: ignore[typeddict-item]
    return meta


def _meta(ctx: LeaseContext, binding: MCPBinding, arguments: dict[str, Any]) -> dict[str, str]:
    key = ctx.idempotency_key
    resource = (
        binding.policy.resource(key, arguments) if binding.policy.resource else default_resource(binding.tool, key)
    )
    token = ctx.signed_fencing_token(resource) if ctx.settings.fencing_key is not None else ctx.fencing_token
    expires_at = datetime.now(UTC) + timedelta(seconds=max(0.0, ctx.confirmed_until - time.monotonic()))  # estimate
    return lease_meta(key, token, resource, expires_at)


async def _read_back(client: Client, settings: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The result a guarded server stored under ``key``, ``None`` when it has none."""
    tool = settings.get("readback_tool")
    if not isinstance(tool, str):
        return None
    try:
        answer = await client.call_tool(tool, {}, meta=_request_meta({IDEMPOTENCY_KEY_META: key}))
    except Exception as exc:  # noqa: BLE001 - a read: nothing to be ambiguous about
        raise RetryableToolError(f"readback {tool} failed: {one_line(_leaf(exc))}") from None
    found = answer.structured_content if not answer.is_error else None
    if not isinstance(found, dict):
        return None
    if found.get("status") == "in_flight":
        raise KeyInFlightError(f"readback {tool}: the call with key {key} is still running at the server")
    if found.get("status") == "in_doubt":
        raise EffectInDoubtError(f"readback {tool}: the server holds key {key} in doubt (it may have taken effect)")
    stored = found.get("result") if found.get("applied") else None
    return stored if isinstance(stored, dict) else None


async def _attempt(ctx: LeaseContext, binding: MCPBinding, args: BaseModel) -> ToolResult:
    """One attempt, renewed every ``renew_every`` from the start (a stdio server may take seconds to start)."""
    waiting = _Waiting(ctx, binding)
    return await _while_renewing(_in_session(ctx, binding, args, waiting), waiting)


async def _in_session(ctx: LeaseContext, binding: MCPBinding, args: BaseModel, waiting: _Waiting) -> ToolResult:
    server, tool = binding.server, binding.tool
    arguments = args.model_dump(mode="json")
    await ctx.advance(Stage.PREFLIGHT, f"connecting to MCP server {server.name} ({server.transport}) for {tool}")
    async with _connected(server) as client:
        await _check_listed(client, binding)
        guard = _guard_settings(client, tool)
        readback = guard is not None and binding.policy.readback is not False
        if readback and guard is not None and ctx.recovery.read_back_first:  # look before sending again
            stored = await _read_back(client, guard, ctx.idempotency_key)
            if stored is not None:
                await ctx.advance(Stage.VERIFY, f"{tool} was applied under the key by an earlier attempt")
                return _settled(ctx, binding, CallToolResult.model_validate(stored), "applied", readback=True)
        await ctx.advance(
            Stage.EXTERNAL_CALL,
            f"tools/call {tool} on {server.name} with key {ctx.idempotency_key}, generation {ctx.fencing_token}",
        )
        waiting.sent()
        try:
            meta = _request_meta(_meta(ctx, binding, arguments))
            result = await client.call_tool(tool, arguments, progress_callback=waiting.on_progress, meta=meta)
        except (LeaseLostError, LedgerUnavailableError):
            raise
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - classified (docs/mcp.md)
            leaf = _leaf(exc)
            if isinstance(leaf, asyncio.CancelledError | LeaseLostError):
                raise leaf from None
            raise _failure(leaf, binding, ctx) from None
        replayed = bool((result.meta or {}).get(REPLAYED_META))
        await ctx.advance(Stage.COMMIT, f"{tool} answered{' (replayed by key)' if replayed else ''}")
        if readback and guard is not None and not result.is_error:
            await ctx.advance(Stage.VERIFY, f"reading {tool} back by key")
            stored = await _read_back(client, guard, ctx.idempotency_key)
            if stored is None:
                raise AmbiguousSideEffectError(f"{tool} answered, but the server holds no result under the key")
            return _settled(
                ctx, binding, CallToolResult.model_validate(stored), "applied", readback=True, replayed=replayed
            )
    return _settled(ctx, binding, result, "error" if result.is_error else "returned", replayed=replayed)


def _settled(
    ctx: LeaseContext,
    binding: MCPBinding,
    result: CallToolResult,
    status: str,
    *,
    readback: bool = False,
    replayed: bool = False,
) -> ToolResult:
    receipt = ctx.receipt(
        f"mcp:{binding.server.name}",
        ctx.idempotency_key,
        status,
        tool=binding.tool,
        generation=ctx.fencing_token,
        read_back=readback,
        replayed=replayed,
    )
    return ToolResult(receipt=receipt, output=_output(result))


def leased_mcp_call(binding: MCPBinding) -> Callable[[LeaseContext, Any], Awaitable[ToolResult]]:
    """The ``(ctx, args) -> ToolResult`` the worker runs in a lease for one declared MCP tool."""

    async def run(ctx: LeaseContext, args: Any) -> ToolResult:
        return await _attempt(ctx, binding, args)

    run.__name__ = run.__qualname__ = f"mcp_{binding.server.name}_{binding.tool}"
    setattr(run, BINDING_ATTRIBUTE, binding)
    return run


def unleased_mcp_call(binding: MCPBinding, args_model: type[BaseModel]) -> Callable[..., Awaitable[dict[str, Any]]]:
    """The direct call of a declared MCP tool outside any lease: a plain ``tools/call`` without ``_meta``."""

    async def direct(**arguments: Any) -> dict[str, Any]:
        args = args_model.model_validate(arguments)
        async with _connected(binding.server) as client:
            try:
                result = await client.call_tool(binding.tool, args.model_dump(mode="json"))
            except BaseException as exc:  # noqa: BLE001 - classified as in a lease
                leaf = _leaf(exc)
                if isinstance(leaf, asyncio.CancelledError):
                    raise leaf from None
                if isinstance(leaf, MCPError):
                    raise PermanentToolError(f"tools/call {binding.tool}: {leaf.message}") from None
                raise AmbiguousSideEffectError(f"tools/call {binding.tool}: {one_line(leaf)}") from None
        return _output(result)

    return direct


__all__ = ["MAX_OUTPUT_CHARS", "leased_mcp_call", "unleased_mcp_call"]
