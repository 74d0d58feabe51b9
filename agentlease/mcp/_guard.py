"""The server side: :class:`LeaseGuard` makes an MCP server enforce the ``_meta`` convention, as the HTTP middleware
does, and serves the readback tool ``agentlease_was_applied`` (``docs/mcp.md``, "Server side"; ``docs/edge.md``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, ToolBinding
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    TextContent,
    ToolAnnotations,
)
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from agentlease.errors import ConfigurationError, InvalidFencingTokenError, StaleFencingTokenError, one_line
from agentlease.fencing import FencingToken, advance_fence, fencing_key_bytes, token_generation
from agentlease.idempotency.convention import (
    ANONYMOUS_REFUSED,
    caller_of,
    request_hash,
    scoped_fence,
    scoped_key,
    stale_facts,
)
from agentlease.idempotency.edge import GuardedCall, Verdict, current_call, run_guarded, serving
from agentlease.idempotency.store import Held, IdempotencyStore, KeyStatus, StoredResponse
from agentlease.mcp._convention import (
    EXTENSION,
    FENCING_TOKEN_META,
    IDEMPOTENCY_KEY_META,
    LEASE_EXPIRES_AT_META,
    READBACK_TOOL,
    REFUSAL_CODE,
    REPLAYED_META,
    RESOURCE_META,
    LeaseMeta,
    MetaError,
    Refusal,
    default_resource,
    read_lease_meta,
    refusal_data,
)

_STORED_STATUS = 200
"""The status a stored ``tools/call`` result carries in the shared ``idempotency_keys`` table."""
IN_FLIGHT_RETRY_MS = 1000
"""How long a call refused ``idempotency_key_in_flight`` is told to wait before it asks again."""

EXPIRY_SKEW = timedelta(seconds=2)
"""How far a worker's clock may be behind the server's: a call whose ``lease-expires-at`` passed more than this long
ago by the server's clock is refused ``lease_expired``."""


def caller_from_request(ctx: ServerRequestContext[Any, Any]) -> str:
    """The default ``caller_for``: the HTTP request's credentials (only a digest is stored), ``""`` over stdio."""
    headers = getattr(ctx.request, "headers", None)
    return "" if headers is None else caller_of(headers)


def tool_names(names: Collection[str], what: str) -> frozenset[str]:
    """``names`` as a set of tool names (``ConfigurationError``: a string, which would be a set of its letters, or
    an item that is not a non-empty string)."""
    if isinstance(names, str | bytes) or not all(isinstance(name, str) and name for name in names):
        raise ConfigurationError(f"LeaseGuard({what}=...) takes a collection of tool names, not {names!r:.80}")
    return frozenset(names)


def _refused(refusal: Refusal, detail: str, **facts: Any) -> MCPError:
    return MCPError(REFUSAL_CODE, detail, refusal_data(refusal, detail, **facts))


def _stale(exc: StaleFencingTokenError, named: str | None) -> MCPError:
    facts = stale_facts(exc, named)
    return _refused(Refusal.STALE_TOKEN, facts.pop("detail"), **facts)


def _arguments_hash(tool: str, arguments: Mapping[str, Any] | None) -> str:
    # JSON carries a lone surrogate ("\ud800") that UTF-8 cannot: kept as it came (surrogatepass), not refused.
    text = json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    body = text.encode("utf-8", "surrogatepass")
    return request_hash("TOOLS/CALL", tool, b"", body)


class LeaseGuard(Extension):
    """Enforces idempotency keys and fencing tokens on an MCP server's tools: an extension of the SDK's
    ``MCPServer`` (``extensions=[guard]``) or a low-level ``Server``'s middleware (``server.middleware.append``).

    Args:
        store: where keys, results and fences live; create its tables with ``await store.create_tables()``.
        tools: the guarded tools. Default ``None``: every tool but the readback tool.
        require_key: refuse a guarded call without ``io.agentlease/idempotency-key`` (false: let it through
            unguarded). Default true.
        require_fencing_token: refuse a call without ``io.agentlease/fencing-token``. Default false. A call with a
            token passes its fence, with a key or without.
        fencing_key: only tokens signed for the resource with it pass. Default ``None``: generations as sent.
        resource_for: ``(tool, idempotency key, arguments) -> resource`` (the key ``""`` for a call without one).
            Default: the resource the client names (``io.agentlease/resource``), else ``mcp/<tool>/<key>``: one
            fence per action; a call with a token and neither is refused.
        caller_for: names the caller a key is scoped to. Default :func:`caller_from_request`.
        anonymous: over HTTP, accept calls that name no caller (``caller_for`` gives ``""``), all in one shared
            scope, where each reads back and fences the others' keys. Default false: refused
            ``missing_credentials``. Over stdio (one client) the caller is always ``""``.
        commits_with_key: tools whose effect commits with their key (in ``effect_transaction`` only): stopped
            before that commit, the key is free again once the store's lock timed out, not in doubt.
        readback_tool: the readback tool's name (``None``: none). Default ``agentlease_was_applied``.
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
        caller_for: Callable[[ServerRequestContext[Any, Any]], str] = caller_from_request,
        anonymous: bool = False,
        commits_with_key: Collection[str] = (),
        readback_tool: str | None = READBACK_TOOL,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.guarded_tools = None if tools is None else tool_names(tools, "tools")
        self.require_key = require_key
        self.require_fencing_token = require_fencing_token
        self.fencing_key = fencing_key_bytes(fencing_key)
        self.resource_for = resource_for
        self.caller_for = caller_for
        self.anonymous = anonymous
        self.commits_with_key = tool_names(commits_with_key, "commits_with_key")
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
        return tool != self.readback_tool and (self.guarded_tools is None or tool in self.guarded_tools)

    def tools(self) -> Sequence[ToolBinding]:
        """The readback tool (``Extension.tools``), unless ``readback_tool=None``."""
        if self.readback_tool is None:
            return ()
        guard = self

        async def was_applied(ctx: Context) -> dict[str, Any]:
            """Whether the call with the idempotency key in ``_meta`` happened: ``applied`` true (with its
            result), false, or null while it is in flight or in doubt (``status`` says which)."""
            request = ctx.request_context
            try:
                meta = read_lease_meta(request.meta)
            except MetaError as exc:
                raise _refused(exc.refusal, str(exc), key=exc.key) from None
            if meta.idempotency_key is None:
                raise _refused(Refusal.MISSING_KEY, f"{IDEMPOTENCY_KEY_META} names the call to read back")
            return await guard.readback(meta.idempotency_key, caller=guard.caller(request))

        hints = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
        return (ToolBinding(fn=was_applied, kwargs={"name": self.readback_tool, "annotations": hints}),)

    async def readback(self, idempotency_key: str, *, caller: str = "") -> dict[str, Any]:
        """What the readback tool answers for ``idempotency_key`` of ``caller``: ``{"applied": true, "status":
        "done", "result": ...}``, ``{"applied": false, "status": "absent"}``, or ``applied`` null with
        ``status`` ``in_flight`` or ``in_doubt``."""
        held = await self.store.lookup(scoped_key(caller, idempotency_key), now=self._now())
        if held is None:
            return {"applied": False, "status": "absent", "result": None}
        if held.status is KeyStatus.DONE and held.response is not None:
            return {"applied": True, "status": "done", "result": json.loads(held.response.body)}
        return {"applied": None, "status": held.status.value, "result": None}

    async def was_applied(self, idempotency_key: str, *, caller: str = "") -> dict[str, Any] | None:
        """The result stored for ``idempotency_key`` of ``caller``; ``None`` if no call with the key answered
        (or its retention passed). :meth:`readback` also tells a call in flight or in doubt."""
        return (await self.readback(idempotency_key, caller=caller))["result"]

    def stored_result(self, result: Any) -> StoredResponse:
        """``result`` (a tool's return value or a ``CallToolResult``) as the answer the guard stores and replays,
        for :meth:`~agentlease.idempotency.store.IdempotencyStore.resolve` of a key in doubt."""
        return _stored_value(result)

    def _now(self) -> datetime | None:
        return None if self.clock is None else self.clock()

    def caller(self, ctx: ServerRequestContext[Any, Any]) -> str:
        """The caller of a request (``caller_for``); over HTTP one that names none is refused
        ``missing_credentials`` unless the guard accepts ``anonymous`` callers."""
        caller = self.caller_for(ctx)
        if not caller and not self.anonymous and getattr(ctx.request, "headers", None) is not None:
            raise _refused(Refusal.MISSING_CREDENTIALS, ANONYMOUS_REFUSED)
        return caller

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """``Extension`` hook of ``MCPServer``: guard ``tools/call`` of a guarded tool."""
        if not self.guards(params.name):
            return await call_next(ctx)
        return await self.guard(params.name, params.arguments, params.meta, self.caller(ctx), lambda: call_next(ctx))

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware of a low-level ``Server`` (``server.middleware.append(guard)``)."""
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        try:  # read as the server reads them (by the wire's names only), else a field could hide the call from us
            params = CallToolRequestParams.model_validate(ctx.params or {}, by_name=False)
        except ValidationError as exc:
            raise MCPError(INVALID_PARAMS, f"tools/call params are malformed: {one_line(exc)}") from None
        return await self.intercept_tool_call(params, ctx, call_next)

    async def guard(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None,
        meta: Mapping[str, Any] | None,
        caller: str,
        run: Callable[[], Any],
    ) -> HandlerResult:
        """Decide one call of a guarded ``tool`` (``docs/mcp.md``); ``run()`` runs the tool. A refusal raises
        ``MCPError`` (code :data:`~agentlease.mcp._convention.REFUSAL_CODE`)."""
        try:
            lease = read_lease_meta(meta)
        except MetaError as exc:
            raise _refused(exc.refusal, str(exc), key=exc.key) from None
        if lease.idempotency_key is None and self.require_key:
            raise _refused(
                Refusal.MISSING_KEY,
                f"{tool} is guarded: send {IDEMPOTENCY_KEY_META} in the request's _meta (agentlease clients do)",
            )
        named = self._fence(tool, lease, arguments or {})
        fence = scoped_fence(caller, named)
        expired = self._expired(lease)  # decided before the key is claimed, refused after the fence
        if lease.idempotency_key is None:  # no key to claim: the fence is passed on arrival and at the commit
            if fence is None:
                if expired is not None:
                    raise expired
                return await run()
            resource = named.resource_key if named else None
            try:
                async with self.store.engine.begin() as conn:
                    await advance_fence(conn, fence.resource_key, fence.generation, now=self._now())
            except StaleFencingTokenError as exc:
                raise _stale(exc, resource) from None
            if expired is not None:
                raise expired
            fenced = GuardedCall(
                None,
                fence,
                caller,
                tool=tool,
                lease_expires_at=lease.lease_expires_at,
                resource=resource,
                _store=self.store,
                _clock=self.clock,
            )

            async def served() -> HandlerResult:
                with serving(fenced):  # effect_transaction checks the fence again
                    return await run()

            return await _answer(fenced, served())
        try:
            claim = await self.store.claim(
                scoped_key(caller, lease.idempotency_key),
                _arguments_hash(tool, arguments),
                fence=fence,
                commits_with_key=tool in self.commits_with_key,
                now=self._now(),
            )
        except StaleFencingTokenError as exc:
            raise _stale(exc, named.resource_key if named else None) from None
        if isinstance(claim, Held):
            return _held(claim, lease.idempotency_key)
        try:  # the tool has not run: whatever stops the call here gives its key back
            if expired is not None:  # after the fence: a newer generation's refusal says more than the lapse
                raise expired
            call = GuardedCall(
                lease.idempotency_key,
                fence,
                caller,
                tool=tool,
                lease_expires_at=lease.lease_expires_at,
                resource=named.resource_key if named else None,
                _store=self.store,
                _claim=claim,
                _answer_of=_stored_value,
                _clock=self.clock,
                _promised=tool in self.commits_with_key,
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.store.release(claim)
            raise
        return await _answer(call, run_guarded(call, run, _verdict))

    def _expired(self, lease: LeaseMeta) -> MCPError | None:
        """``lease_expired`` when the caller's lease-expires-at passed over :data:`EXPIRY_SKEW` ago by this clock
        (a difference of times, never a sum: an expiry at the end of the calendar cannot overflow)."""
        now = self._now() or datetime.now(UTC)
        expires = lease.lease_expires_at
        if expires is None or expires > now or now - expires < EXPIRY_SKEW:
            return None
        return _refused(
            Refusal.LEASE_EXPIRED,
            f"{LEASE_EXPIRES_AT_META} {expires.isoformat()} has passed (now {now.isoformat()}): "
            "the caller's lease lapsed",
            key=LEASE_EXPIRES_AT_META,
        )

    def _fence(self, tool: str, lease: LeaseMeta, arguments: Mapping[str, Any]) -> FencingToken | None:
        """The call's fenced resource and generation (verified with a fencing key), ``None`` without a token."""
        if lease.fencing_token is None:
            if self.require_fencing_token:
                raise _refused(Refusal.MISSING_TOKEN, f"{tool} needs io.agentlease/fencing-token in _meta")
            return None
        key = lease.idempotency_key
        if self.resource_for is not None:
            resource = self.resource_for(tool, key or "", arguments)
        elif lease.resource:
            resource = lease.resource
        elif key is not None:
            resource = default_resource(tool, key)
        else:  # the default resource is named after the key
            raise _refused(
                Refusal.INVALID_RESOURCE,
                f"{FENCING_TOKEN_META} without {IDEMPOTENCY_KEY_META} needs {RESOURCE_META}: the resource it fences",
                key=RESOURCE_META,
            )
        try:
            return FencingToken(resource, token_generation(resource, lease.fencing_token, self.fencing_key))
        except InvalidFencingTokenError as exc:
            raise _refused(Refusal.INVALID_TOKEN, str(exc), resource=resource) from None
        except ValueError as exc:
            raise _refused(
                Refusal.INVALID_RESOURCE if "resource" in str(exc) else Refusal.INVALID_TOKEN, str(exc)
            ) from None


def _held(held: Held, key: str) -> CallToolResult:
    """The answer to a call whose key another call holds: its stored result, or a refusal."""
    if not held.same_request:
        raise _refused(
            Refusal.KEY_REUSED, f"{IDEMPOTENCY_KEY_META} {key!r} was used for another call (tool or arguments)"
        )
    if held.status is KeyStatus.DONE and held.response is not None:
        result = CallToolResult.model_validate_json(held.response.body)
        return result.model_copy(update={"meta": {**(result.meta or {}), REPLAYED_META: True}})
    if held.status is KeyStatus.IN_DOUBT:
        raise _refused(
            Refusal.IN_DOUBT,
            f"the call with {key!r} started and its outcome is unknown: it may have taken effect; "
            "the server's owner or a person decides",
        )
    raise _refused(Refusal.IN_FLIGHT, f"a call with {key!r} is still running", retry_after_ms=IN_FLIGHT_RETRY_MS)


def _stored_value(value: Any) -> StoredResponse:
    """A tool's answer as the guard stores it (a ``CallToolResult``, as the SDK would return it)."""
    if isinstance(value, CallToolResult):
        result = value
    elif isinstance(value, Mapping) and "content" in value:
        return StoredResponse(_STORED_STATUS, [], json.dumps(dict(value)).encode("utf-8"))
    else:
        plain = to_jsonable_python(value)
        text = plain if isinstance(plain, str) else json.dumps(plain, ensure_ascii=False)
        structured = plain if isinstance(plain, dict) else None
        result = CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)
    return StoredResponse(_STORED_STATUS, [], result.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8"))


def _failed(result: Any) -> bool:
    """Whether a tool's result is an error result."""
    if isinstance(result, CallToolResult):
        return result.is_error
    return bool(isinstance(result, Mapping) and result.get("isError"))


def _verdict(result: Any) -> tuple[Verdict, StoredResponse | None]:
    """A tool's result: an answer unless it is an error result (the tool failed, and did not say before any effect)
    or a request for more input (the round that brings the answers runs the tool)."""
    if isinstance(result, InputRequiredResult) or (
        isinstance(result, Mapping) and result.get("resultType") == "input_required"
    ):
        return Verdict.ASKED, None
    return (Verdict.FAILED if _failed(result) else Verdict.ANSWERED), _stored_value(result)


async def _answer(call: GuardedCall, running: Awaitable[HandlerResult]) -> HandlerResult:
    """The tool's result; but the ``stale_fencing_token`` refusal when the call's own fence refused its write, let
    out by a low-level server's handler or made an error result by ``MCPServer``. A refusal of another resource's
    fence is the tool's own error (its key in doubt)."""
    try:
        result = await running
    except StaleFencingTokenError as exc:
        if exc is not call._fence_refused:
            raise
        raise _stale(exc, call.resource) from None
    if call._fence_refused is not None and _failed(result):
        raise _stale(call._fence_refused, call.resource)
    return result


__all__ = ["READBACK_TOOL", "GuardedCall", "LeaseGuard", "caller_from_request", "current_call"]
