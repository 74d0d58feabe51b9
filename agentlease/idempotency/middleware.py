"""ASGI middleware enforcing idempotency keys and fencing tokens at a downstream service (``docs/edge.md``, "Over
HTTP: the headers"); a handler reads its call as ``request.state.idempotency``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import anyio

try:
    from starlette.datastructures import Headers
    from starlette.requests import HTTPConnection
    from starlette.responses import JSONResponse, Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as _import_error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "IdempotencyMiddleware needs the 'middleware' extra: pip install 'agentlease[middleware]'"
    ) from _import_error

from agentlease.errors import InvalidFencingTokenError, StaleFencingTokenError
from agentlease.fencing import FencingToken, fencing_key_bytes, token_generation
from agentlease.idempotency.convention import (
    ANONYMOUS_REFUSED,
    FENCING_RESOURCE_HEADER,
    FENCING_TOKEN_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    IN_DOUBT,
    IN_FLIGHT,
    MISSING_CREDENTIALS,
    MUTATING_METHODS,
    REPLAYED_HEADER,
    STALE,
    HeaderError,
    caller_of,
    parse_fencing_resource,
    parse_idempotency_key,
    raw_fencing_token,
    request_hash,
    scoped_fence,
    scoped_key,
    stale_facts,
)
from agentlease.idempotency.edge import GuardedCall, Verdict, current_call, run_guarded
from agentlease.idempotency.store import Held, IdempotencyStore, KeyStatus, StoredResponse
from agentlease.limits import is_decimal


def request_path(connection: HTTPConnection) -> str:
    """A ``resource_for`` that fences the request's path (one fence per route, not per action)."""
    return connection.url.path


MAX_BODY_BYTES = 1024 * 1024
"""Default largest request body the middleware reads (1 MiB); a larger one is answered 413."""

BODY_TIMEOUT_S = 30.0
"""Default seconds a request's body may take to arrive; a slower one is answered 408."""


def caller_from_credentials(connection: HTTPConnection) -> str:
    """The default ``caller_for``: the request's credentials (:func:`~agentlease.idempotency.convention.caller_of`),
    stored only as a digest."""
    return caller_of(connection.headers)


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


def _error(status: int, code: str, detail: str, **facts: object) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail, **facts}, status_code=status)


def _stale(exc: StaleFencingTokenError, resource: str | None) -> JSONResponse:
    """409 ``stale_fencing_token``, naming ``resource`` as the client sent it (``None``: as the error names it)."""
    return _error(409, STALE, **stale_facts(exc, resource))


def stale_fencing_response(exc: StaleFencingTokenError) -> JSONResponse:
    """The convention's 409 ``stale_fencing_token`` answer, for a handler whose own fence check refused its write
    (or it lets the error propagate); its call counts as not applied and its key is given back."""
    call = current_call()
    if call is not None:
        call.not_applied()
    return _stale(exc, None if call is None else call.resource)


async def _read_body(receive: Receive, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes | None:
    """The whole request body (``None``: the client disconnected first); :class:`_TooLarge`, :class:`_TooSlow`."""
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise _TooLarge
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise _TooSlow from None


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read body to the app, then defers to the client: a handler that streams
    until its client leaves hears of it (a response it cuts short never replaces a stored answer, :func:`_verdict`)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _kept(raw_headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The headers a replay sends again: all but the first caller's cookies."""
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in raw_headers
        if name.lower() != b"set-cookie"
    ]


def _captured(messages: list[Message]) -> StoredResponse:
    start = next((m for m in messages if m["type"] == "http.response.start"), None)
    if start is None:
        raise RuntimeError("the application returned without starting a response")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return StoredResponse(start["status"], _kept(start.get("headers", [])), body)


def _replay(stored: StoredResponse) -> Response:
    response = Response(stored.body, status_code=stored.status)
    response.raw_headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in stored.headers]
    response.raw_headers.append((REPLAYED_HEADER.lower().encode("latin-1"), b"true"))
    return response


def _held(held: Held, key: str) -> Response:
    if not held.same_request:
        return _error(422, "idempotency_key_reused", f"{IDEMPOTENCY_KEY_HEADER} {key!r} was used with other arguments")
    if held.status is KeyStatus.DONE and held.response is not None:
        return _replay(held.response)
    if held.status is KeyStatus.IN_DOUBT:
        detail = f"a request with {key!r} started and its outcome is unknown: it may have taken effect"
        return _error(409, IN_DOUBT, detail)
    answer = _error(409, IN_FLIGHT, f"a request with {key!r} is still executing")
    answer.headers["Retry-After"] = "1"
    return answer


_FILE_SENDS = ("http.response.pathsend", "http.response.zerocopysend")
"""ASGI extensions by which an app hands the server a file instead of its bytes: hidden from a guarded handler,
so that its answer's body passes through the middleware, which stores it."""


def _without_file_sends(scope: Scope) -> Scope:
    """``scope`` without :data:`_FILE_SENDS` (a ``FileResponse`` then sends its body as messages)."""
    extensions = scope.get("extensions") or {}
    if not any(name in extensions for name in _FILE_SENDS):
        return scope
    return {**scope, "extensions": {k: v for k, v in extensions.items() if k not in _FILE_SENDS}}


def _complete(messages: list[Message]) -> bool:
    """Whether the app sent a whole response: its last body message says no more body follows."""
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    return bool(bodies) and not bodies[-1].get("more_body", False)


def _over(length: str, limit: int) -> bool:
    """Whether the decimal ``length`` is over ``limit``, compared as text first: ``int()`` refuses over 4,300
    digits, which a server that does not check ``Content-Length`` itself may pass on."""
    digits = length.lstrip("0")
    return len(digits) > len(str(limit)) or int(digits or "0") > limit


def _verdict(messages: list[Message]) -> tuple[Verdict, StoredResponse]:
    """The handler's response: a whole one below 500 is an answer; one from 500, or cut short, a failure (never
    stored: the key is held in doubt, or keeps the answer its effect committed with)."""
    response = _captured(messages)
    answered = response.status < 500 and _complete(messages)
    return (Verdict.ANSWERED if answered else Verdict.FAILED), response


def _stored_response(response: Response) -> StoredResponse:
    """A response given to ``EffectTransaction.done``, as it is stored."""
    return StoredResponse(response.status_code, _kept(response.raw_headers), bytes(response.body))


class IdempotencyMiddleware:
    """Pure ASGI middleware: idempotency keys and fencing tokens for mutating requests (``docs/edge.md``).

    Args:
        app / store: the wrapped ASGI app; where keys, answers and fences live (the service's database).
        resource_for: names a request's fenced resource, over the client's. Default: the client's, else the key.
        require_fencing_token: answer 400 to a mutating request without ``Fencing-Token``. Default ``False``.
        fencing_key: ``AGENTLEASE_FENCING_KEY``: only tokens it signed for the resource pass. Default ``None``.
        caller_for: names the caller a key is scoped to. Default :func:`caller_from_credentials`.
        anonymous: accept requests that name no caller (``caller_for`` gives ``""``: no ``Authorization`` nor
            ``X-API-Key``), all in one shared scope, where each reads back and fences the others' keys. Default
            false: such a request is refused ``401 missing_credentials``.
        commits_with_key: every handler commits its effect with its key (``effect_transaction``): a key whose
            holder vanished is free again once its lock timed out, not held in doubt. Default ``False``.
        max_body_bytes: the largest body read; larger is 413. Default :data:`MAX_BODY_BYTES`.
        body_timeout_s: seconds the body may take to arrive; slower is 408. Default :data:`BODY_TIMEOUT_S`.
        clock: returns the current time (aware) for every statement. Default ``None``: the database's clock.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: IdempotencyStore,
        resource_for: Callable[[HTTPConnection], str] | None = None,
        require_fencing_token: bool = False,
        clock: Callable[[], datetime] | None = None,
        fencing_key: bytes | str | None = None,
        caller_for: Callable[[HTTPConnection], str] = caller_from_credentials,
        anonymous: bool = False,
        commits_with_key: bool = False,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.store = store
        self.resource_for = resource_for
        self.require_fencing_token = require_fencing_token
        self.clock = clock
        self.fencing_key = fencing_key_bytes(fencing_key)
        self.caller_for = caller_for
        self.anonymous = anonymous
        self.commits_with_key = commits_with_key
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    def _now(self) -> datetime | None:
        return None if self.clock is None else self.clock()

    def _fence(self, scope: Scope, headers: Headers, key: str) -> FencingToken | None:
        raw = raw_fencing_token(headers.getlist(FENCING_TOKEN_HEADER))
        if raw is None:
            if self.require_fencing_token:
                raise HeaderError(FENCING_TOKEN_HEADER, "missing_fencing_token", f"{FENCING_TOKEN_HEADER} is required")
            return None
        named = parse_fencing_resource(headers.getlist(FENCING_RESOURCE_HEADER))
        if self.resource_for is not None:
            resource = parse_fencing_resource([self.resource_for(HTTPConnection(scope))]) or ""
        else:
            resource = named or key
        try:
            return FencingToken(resource, token_generation(resource, raw, self.fencing_key))
        except InvalidFencingTokenError as exc:
            raise HeaderError(FENCING_TOKEN_HEADER, "invalid_fencing_token", str(exc)) from None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            key = parse_idempotency_key(headers.getlist(IDEMPOTENCY_KEY_HEADER))
            fence = self._fence(scope, headers, key)
        except HeaderError as exc:
            await _error(400, exc.code, str(exc), header=exc.header)(scope, receive, send)
            return
        too_large = _error(413, "request_too_large", f"the request body is larger than {self.max_body_bytes} bytes")
        length = headers.get("content-length", "")
        if is_decimal(length) and _over(length, self.max_body_bytes):
            await too_large(scope, receive, send)
            return
        try:
            body = await _read_body(receive, self.max_body_bytes, self.body_timeout_s)
        except _TooLarge:
            await too_large(scope, receive, send)
            return
        except _TooSlow:
            slow = f"the request body did not arrive within {self.body_timeout_s:g}s"
            await _error(408, "request_timeout", slow)(scope, receive, send)
            return
        if body is None:
            return
        digest = request_hash(scope["method"], scope["path"], scope.get("query_string", b""), body)
        caller = self.caller_for(HTTPConnection(scope))
        if not caller and not self.anonymous:
            await _error(401, MISSING_CREDENTIALS, ANONYMOUS_REFUSED)(scope, receive, send)
            return
        stored_fence = scoped_fence(caller, fence)  # the caller's own copy of the resource it named
        try:
            claim = await self.store.claim(
                scoped_key(caller, key),
                digest,
                fence=stored_fence,
                commits_with_key=self.commits_with_key,
                now=self._now(),
            )
        except StaleFencingTokenError as exc:
            await _stale(exc, fence.resource_key if fence else None)(scope, receive, send)
            return
        if isinstance(claim, Held):
            await _held(claim, key)(scope, receive, send)
            return
        call = GuardedCall(
            key,
            stored_fence,
            caller,
            resource=fence.resource_key if fence else None,
            _store=self.store,
            _claim=claim,
            _answer_of=_stored_response,
            _clock=self.clock,
            _promised=self.commits_with_key,
        )
        state = scope.setdefault("state", {})
        state["idempotency"] = call
        state["idempotency_key"] = key
        state["fencing"] = stored_fence
        messages: list[Message] = []

        async def capture(message: Message) -> None:
            messages.append(message)

        async def handle() -> list[Message]:
            await self.app(_without_file_sends(scope), _replaying(body, receive), capture)
            return messages

        try:
            await run_guarded(call, handle, _verdict)
        except StaleFencingTokenError as exc:
            if exc is not call._fence_refused:  # another resource's: says nothing of this call (key in doubt)
                raise
            messages = []  # the handler's own fence check, left to propagate (key given back)
            await _stale(exc, call.resource)(scope, receive, capture)
        for message in messages:
            await send(message)
