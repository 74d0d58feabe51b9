"""The server side: an MCP server that enforces the ``_meta`` convention, as the HTTP middleware does.

:class:`LeaseGuard` is an extension of the official SDK's ``MCPServer`` (``MCPServer(...,
extensions=[guard])``) and, for a low-level ``Server``, a middleware (``server.middleware.append(guard)``).
For each ``tools/call`` of a guarded tool it decides, in this order:

1. a malformed convention entry, a missing key (``require_key``, default on) or a missing fencing
   token (``require_fencing_token``) is refused;
2. the key (scoped to the caller) is claimed and the fence of the call's resource is checked and moved
   in ONE transaction of the :class:`~agentlease.idempotency.store.IdempotencyStore` (its
   ``idempotency_keys`` and ``fences`` tables), so a stale call never reaches the tool;
3. a key already held: the call's token must still pass the fence (and moves it when newer), else the
   call is refused ``stale_fencing_token``, even where a result is stored: a superseded holder learns
   that it lost instead of reading a result. Then a call of another tool or with other arguments is
   refused ``idempotency_key_reused``, a stored result is replayed (``_meta`` ``io.agentlease/replayed``),
   and a call still running is refused ``idempotency_key_in_flight`` (try again);
4. otherwise the tool runs once, with :func:`current_call` telling it the key and fence (to check the
   fence again inside its own write transaction). A result that is not an error is stored and
   replayed for the store's retention; an error result, an exception or a cancelled call gives the
   key back, so the tool must leave no partial effect when it fails.

The readback hook, :meth:`LeaseGuard.was_applied`, answers "did the call with this key happen?" with the
stored result; the guard also serves it as the tool ``agentlease_was_applied`` (read-only), which an
agentlease client calls with the key in ``_meta`` to read a call back before it settles.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, ToolBinding
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, CallToolResult, ToolAnnotations
from pydantic import ValidationError

from agentlease.errors import InvalidFencingTokenError, StaleFencingTokenError
from agentlease.fencing import FencingToken, advance_fence, token_generation
from agentlease.idempotency.convention import request_hash
from agentlease.idempotency.middleware import scoped_key
from agentlease.idempotency.store import Claimed, IdempotencyStore, KeyStatus, StoredResponse
from agentlease.mcp._convention import (
    EXTENSION,
    IDEMPOTENCY_KEY_META,
    REFUSAL_CODE,
    REPLAYED_META,
    LeaseMeta,
    MetaError,
    Refusal,
    default_resource,
    read_lease_meta,
    refusal_data,
)

READBACK_TOOL = "agentlease_was_applied"
"""The default name of the readback tool a guard serves."""

_STORED_STATUS = 200
"""The status a stored ``tools/call`` result carries in the shared ``idempotency_keys`` table."""
_IN_FLIGHT_RETRY_MS = 1000


@dataclass(frozen=True)
class GuardedCall:
    """What the guard tells the running tool about its call (:func:`current_call`).

    Attributes:
        tool: the tool's name.
        idempotency_key: the call's key as the client sent it (not scoped).
        fencing: the fenced resource and the call's generation; ``None`` when the call carried no token.
        lease_expires_at: when the client's lease lapses unless renewed, by its estimate; ``None`` if not sent.
        caller: the caller the key is scoped to (``""``: the one caller of a stdio server, or anonymous).
    """

    tool: str
    idempotency_key: str
    fencing: FencingToken | None
    lease_expires_at: datetime | None
    caller: str


_current: ContextVar[GuardedCall | None] = ContextVar("agentlease_mcp_call", default=None)


def current_call() -> GuardedCall | None:
    """The guarded call the running tool serves, ``None`` outside one (an unguarded tool, no key)."""
    return _current.get()


@contextmanager
def _serving(call: GuardedCall) -> Iterator[None]:
    token = _current.set(call)
    try:
        yield
    finally:
        _current.reset(token)


def caller_from_request(ctx: ServerRequestContext[Any, Any]) -> str:
    """The default ``caller_for``: the HTTP request's ``Authorization`` (or else ``X-API-Key``) header,
    ``""`` without one (stdio: the one client that started the server). Only a digest is stored."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return ""
    return str(headers.get("authorization") or headers.get("x-api-key") or "")


def _refused(refusal: Refusal, detail: str, **facts: Any) -> MCPError:
    return MCPError(REFUSAL_CODE, detail, refusal_data(refusal, detail, **facts))


def _stale(exc: StaleFencingTokenError) -> MCPError:
    return _refused(
        Refusal.STALE_TOKEN,
        str(exc),
        resource=exc.resource_key,
        generation=exc.generation,
        current_generation=exc.current_generation,
    )


def _arguments_hash(tool: str, arguments: Mapping[str, Any] | None) -> str:
    body = json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return request_hash("TOOLS/CALL", tool, b"", body)


class LeaseGuard(Extension):
    """Enforces idempotency keys and fencing tokens on an MCP server's tools (see the module docstring).

    Args:
        store: where keys, results and fences live (the server's database); create its tables at
            startup with ``await store.create_tables()``.
        tools: the guarded tools. Default ``None``: every tool but the readback tool.
        require_key: refuse a call of a guarded tool without ``io.agentlease/idempotency-key``.
            Default true; false lets such calls through unguarded.
        require_fencing_token: refuse a call without ``io.agentlease/fencing-token``. Default false.
        fencing_key: the shared fencing key (``AGENTLEASE_FENCING_KEY``): only tokens signed for the
            resource pass. Default ``None``: generations are taken as sent.
        resource_for: names the fenced resource of a call, ``(tool, idempotency key, arguments) -> str``.
            Default :func:`~agentlease.mcp._convention.default_resource` (``mcp/<tool>/<key>``).
        client_named_resource: take the client's ``io.agentlease/resource`` instead. Default false.
        caller_for: names the caller a key is scoped to. Default :func:`caller_from_request`.
        readback_tool: the name of the readback tool the guard serves; ``None``: none. Default
            ``agentlease_was_applied``.
        clock: the current time (aware) for every statement; default ``None``, the database's clock.
    """

    identifier = EXTENSION

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        tools: Collection[str] | None = None,
        require_key: bool = True,
        require_fencing_token: bool = False,
        fencing_key: bytes | str | None = None,
        resource_for: Callable[[str, str, Mapping[str, Any]], str] | None = None,
        client_named_resource: bool = False,
        caller_for: Callable[[ServerRequestContext[Any, Any]], str] = caller_from_request,
        readback_tool: str | None = READBACK_TOOL,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.guarded_tools = None if tools is None else frozenset(tools)
        self.require_key = require_key
        self.require_fencing_token = require_fencing_token
        self.fencing_key = fencing_key.encode("utf-8") if isinstance(fencing_key, str) else fencing_key
        self.resource_for = resource_for
        self.client_named_resource = client_named_resource
        self.caller_for = caller_for
        self.readback_tool = readback_tool
        self.clock = clock

    def settings(self) -> dict[str, Any]:
        """What the server advertises under ``capabilities.extensions["io.agentlease/lease"]``."""
        return {
            "version": 1,
            "tools": "*" if self.guarded_tools is None else sorted(self.guarded_tools),
            "readback_tool": self.readback_tool,
            "require_key": self.require_key,
            "require_fencing_token": self.require_fencing_token,
        }

    def guards(self, tool: str) -> bool:
        """Whether calls of ``tool`` are guarded."""
        if tool == self.readback_tool:
            return False
        return self.guarded_tools is None or tool in self.guarded_tools

    def tools(self) -> Sequence[ToolBinding]:
        """The readback tool (``Extension.tools``), unless ``readback_tool=None``."""
        if self.readback_tool is None:
            return ()
        guard = self

        async def was_applied(ctx: Context) -> dict[str, Any]:
            """Whether the call with the idempotency key in ``_meta`` happened: its stored result, or none."""
            request = ctx.request_context
            meta = read_lease_meta(request.meta)
            if meta.idempotency_key is None:
                raise _refused(Refusal.MISSING_KEY, f"{IDEMPOTENCY_KEY_META} names the call to read back")
            found = await guard.was_applied(meta.idempotency_key, caller=guard.caller_for(request))
            return {"applied": found is not None, "result": found}

        binding = ToolBinding(
            fn=was_applied,
            kwargs={
                "name": self.readback_tool,
                "annotations": ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
            },
        )
        return (binding,)

    async def was_applied(self, idempotency_key: str, *, caller: str = "") -> dict[str, Any] | None:
        """The readback hook: the result stored for ``idempotency_key`` of ``caller``, ``None`` if no call
        with the key completed (or its retention passed)."""
        return await _stored(self.store, scoped_key(caller, idempotency_key), self.clock)

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """``Extension`` hook of ``MCPServer``: guard ``tools/call`` of a guarded tool."""
        if not self.guards(params.name):
            return await call_next(ctx)
        return await self.guard(
            params.name, params.arguments, params.meta, self.caller_for(ctx), lambda: call_next(ctx)
        )

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware of a low-level ``Server`` (``server.middleware.append(guard)``)."""
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        try:
            params = CallToolRequestParams.model_validate(ctx.params or {})
        except ValidationError:
            return await call_next(ctx)  # the server answers the malformed request itself
        if not self.guards(params.name):
            return await call_next(ctx)
        return await self.guard(
            params.name, params.arguments, params.meta, self.caller_for(ctx), lambda: call_next(ctx)
        )

    async def guard(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None,
        meta: Mapping[str, Any] | None,
        caller: str,
        run: Callable[[], Any],
    ) -> HandlerResult:
        """Decide one call of a guarded ``tool`` (the module docstring's order); ``run()`` runs the tool.

        Raises:
            MCPError: a refusal (code :data:`~agentlease.mcp._convention.REFUSAL_CODE`).
        """
        try:
            lease = read_lease_meta(meta)
        except MetaError as exc:
            raise _refused(exc.refusal, str(exc), key=exc.key) from None
        if lease.idempotency_key is None:
            if self.require_key:
                raise _refused(
                    Refusal.MISSING_KEY,
                    f"{tool} is guarded: send {IDEMPOTENCY_KEY_META} in the request's _meta (agentlease clients do)",
                )
            return await run()
        fence = self._fence(tool, lease, arguments or {})
        key = scoped_key(caller, lease.idempotency_key)
        digest = _arguments_hash(tool, arguments)
        now = None if self.clock is None else self.clock()
        try:
            claim = await self.store.claim(key, digest, fence=fence, now=now)
        except StaleFencingTokenError as exc:
            raise _stale(exc) from None
        if not isinstance(claim, Claimed):
            if fence is not None:  # a held key still answers only to the newest generation
                try:
                    async with self.store.engine.begin() as conn:
                        await advance_fence(conn, fence.resource_key, fence.generation, now=now)
                except StaleFencingTokenError as exc:
                    raise _stale(exc) from None
            if not claim.same_request:
                raise _refused(
                    Refusal.KEY_REUSED,
                    f"{IDEMPOTENCY_KEY_META} {lease.idempotency_key!r} was used for another call (tool or arguments)",
                )
            if claim.status == KeyStatus.DONE and claim.response is not None:
                return _replayed(claim.response)
            raise _refused(
                Refusal.IN_FLIGHT,
                f"a call with {lease.idempotency_key!r} is still running",
                retry_after_ms=_IN_FLIGHT_RETRY_MS,
            )
        call = GuardedCall(tool, lease.idempotency_key, fence, lease.lease_expires_at, caller)
        try:
            with _serving(call):
                result = await run()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.store.release(claim)
            raise
        stored = _storable(result)
        if stored is None:
            await self.store.release(claim)
        else:
            await self.store.complete(claim, stored, now=None if self.clock is None else self.clock())
        return result

    def _fence(self, tool: str, lease: LeaseMeta, arguments: Mapping[str, Any]) -> FencingToken | None:
        """The call's fenced resource and generation (verified with a fencing key), ``None`` without a token.

        Raises:
            MCPError: a missing token (``require_fencing_token``), or one that does not verify.
        """
        if lease.fencing_token is None:
            if self.require_fencing_token:
                raise _refused(Refusal.MISSING_TOKEN, f"{tool} needs io.agentlease/fencing-token in _meta")
            return None
        assert lease.idempotency_key is not None
        if self.client_named_resource and lease.resource is not None:
            resource = lease.resource
        elif self.resource_for is not None:
            resource = self.resource_for(tool, lease.idempotency_key, arguments)
        else:
            resource = default_resource(tool, lease.idempotency_key)
        try:
            return FencingToken(resource, token_generation(resource, lease.fencing_token, self.fencing_key))
        except InvalidFencingTokenError as exc:
            raise _refused(Refusal.INVALID_TOKEN, str(exc), resource=resource) from None
        except ValueError as exc:
            raise _refused(
                Refusal.INVALID_RESOURCE if "resource" in str(exc) else Refusal.INVALID_TOKEN, str(exc)
            ) from None


def _storable(result: Any) -> StoredResponse | None:
    """A result to store under the key: a ``CallToolResult`` that is not an error; else ``None``."""
    if isinstance(result, CallToolResult) and not result.is_error:
        body = result.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8")
        return StoredResponse(_STORED_STATUS, [], body)
    if isinstance(result, Mapping) and not result.get("isError") and "content" in result:
        return StoredResponse(_STORED_STATUS, [], json.dumps(dict(result)).encode("utf-8"))
    return None


def _replayed(stored: StoredResponse) -> CallToolResult:
    result = CallToolResult.model_validate_json(stored.body)
    return result.model_copy(update={"meta": {**(result.meta or {}), REPLAYED_META: True}})


async def _stored(store: IdempotencyStore, key: str, clock: Callable[[], datetime] | None) -> dict[str, Any] | None:
    from sqlalchemy import select

    from agentlease.clock import db_now_ms
    from agentlease.idempotency.store import idempotency_keys

    columns = idempotency_keys.c
    now_ms = db_now_ms(store.engine.dialect.name, None if clock is None else clock())
    async with store.engine.connect() as conn:
        row = (
            await conn.execute(
                select(columns.response_body).where(
                    columns.key == key,
                    columns.status == KeyStatus.DONE.value,
                    columns.expires_at_ms > now_ms,
                )
            )
        ).first()
    if row is None or row.response_body is None:
        return None
    found: dict[str, Any] = json.loads(bytes(row.response_body))
    return found


__all__ = ["READBACK_TOOL", "GuardedCall", "LeaseGuard", "caller_from_request", "current_call"]
