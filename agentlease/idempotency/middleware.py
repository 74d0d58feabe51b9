"""ASGI middleware enforcing idempotency keys and fencing tokens at a downstream service.

The HTTP convention (what agentlease tools send, what the service answers):

Requests
    ``POST``, ``PUT``, ``PATCH`` and ``DELETE`` carry ``Idempotency-Key`` (1 to 255 printable ASCII
    characters, bare or as a quoted structured-field string). A fenced write also carries
    ``Fencing-Token``: the claim generation of the writer's lease, a decimal integer. The fenced
    resource is named by the ``Fencing-Resource`` header when present, otherwise by the service's
    ``resource_for(request)`` function, which by default is the request path (``/articles/42``).
    Every other method (``GET``, ``HEAD``, ``OPTIONS``) passes through untouched.

Answers, in the order they are decided
    - 400 ``missing_idempotency_key`` / ``invalid_idempotency_key`` / ``invalid_fencing_token`` /
      ``invalid_fencing_resource`` / ``repeated_*``: a malformed convention header. With
      ``require_fencing_token=True`` a missing token is 400 ``missing_fencing_token``.
    - 422 ``idempotency_key_reused``: the key was used for a request with other arguments (the
      SHA-256 of method, path, query string and body bytes differs), whatever its state.
    - replay: the key's first response is stored; it is sent again, with its status, headers
      and body, plus ``Idempotent-Replayed: true``. The handler does not run. A replay wins over
      a stale token: it repeats a response, it does not write.
    - 409 ``idempotency_key_in_flight`` (with ``Retry-After: 1``): another request with the key is
      still executing.
    - 409 ``stale_fencing_token``: the resource has accepted a newer generation. Body:
      ``{"error": "stale_fencing_token", "resource": ..., "generation": ..., "current_generation": ...}``.
      Nothing is stored under the key, so the action's next attempt (newer token, same key) runs.
    - otherwise the handler runs once.

Each answer of the middleware itself is a JSON object ``{"error": CODE, "detail": TEXT, ...}``.

Order of the steps, and why
    1. The key is claimed and the fence is checked and advanced in ONE transaction before the
       handler runs (:meth:`~agentlease.idempotency.store.IdempotencyStore.claim`): a stale writer
       never reaches the handler, and a refused fence leaves no claim behind. Once committed, the
       fence advance is never lost and never rolled back, even if the handler then fails: the
       newer generation is authoritative anyway, and an older writer must not write after it.
    2. The handler runs with ``request.state.idempotency_key`` and ``request.state.fencing`` (a
       :class:`~agentlease.fencing.FencingToken` or ``None``). For a write that is atomic with its
       fence, the handler calls :func:`~agentlease.fencing.advance_fence` again inside its own
       write transaction (equal generations pass): this also covers a newer writer that passed
       step 1 while this one was between step 1 and its write.
    3. A response with a status below 500 is stored (keys expire after the store's ``retention``,
       default 24h) and then sent, so a client that saw it always gets the replay afterwards. A
       5xx response, an exception or a cancelled request releases the key: the next request with
       it runs the handler again, so a handler must leave no partial effect when it fails.
    4. A handler that outlives the in-flight lock (``lock_timeout``, default 60s) can be taken over
       by a later request with the key; its own response is then sent but not stored.

Configure the retention and the lock timeout on the
:class:`~agentlease.idempotency.store.IdempotencyStore`; see there for the table, which the service
creates at startup with ``await store.create_tables()``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import anyio
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import FencingToken
from agentlease.idempotency.convention import (
    FENCING_RESOURCE_HEADER,
    FENCING_TOKEN_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    MUTATING_METHODS,
    REPLAYED_HEADER,
    HeaderError,
    parse_fencing_resource,
    parse_fencing_token,
    parse_idempotency_key,
    request_hash,
)
from agentlease.idempotency.store import Claimed, IdempotencyStore, KeyStatus, StoredResponse


def request_path(connection: HTTPConnection) -> str:
    """The default ``resource_for``: the request's path."""
    return connection.url.path


def _error(status: int, code: str, detail: str, **facts: object) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail, **facts}, status_code=status)


def stale_fencing_response(exc: StaleFencingTokenError) -> JSONResponse:
    """The convention's 409 ``stale_fencing_token`` answer; also for a handler whose own fence
    check (inside its write transaction) refused the token."""
    return _error(
        409,
        "stale_fencing_token",
        str(exc),
        resource=exc.resource_key,
        generation=exc.generation,
        current_generation=exc.current_generation,
    )


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or ``None`` if the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read body to the app, then defers to the client."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _captured(messages: list[Message]) -> StoredResponse:
    start = next((m for m in messages if m["type"] == "http.response.start"), None)
    if start is None:
        raise RuntimeError("the application returned without starting a response")
    headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in start.get("headers", [])]
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return StoredResponse(start["status"], headers, body)


def _replay(stored: StoredResponse) -> Response:
    response = Response(stored.body, status_code=stored.status)
    response.raw_headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in stored.headers]
    response.raw_headers.append((REPLAYED_HEADER.lower().encode("latin-1"), b"true"))
    return response


class IdempotencyMiddleware:
    """Pure ASGI middleware: idempotency keys and fencing tokens for mutating requests.

    Args:
        app: the wrapped ASGI app.
        store: where keys, responses and fences live (the service's database).
        resource_for: names the fenced resource of a request without a ``Fencing-Resource``
            header. Default :func:`request_path`.
        require_fencing_token: answer 400 to a mutating request without ``Fencing-Token``.
            Default ``False`` (idempotent-only clients send just the key).
        clock: returns the current time (aware) for every statement; default ``None``, the
            database's clock. Tests inject time here.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: IdempotencyStore,
        resource_for: Callable[[HTTPConnection], str] = request_path,
        require_fencing_token: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.resource_for = resource_for
        self.require_fencing_token = require_fencing_token
        self.clock = clock

    def _now(self) -> datetime | None:
        return None if self.clock is None else self.clock()

    def _fence(self, scope: Scope, headers: Headers) -> FencingToken | None:
        generation = parse_fencing_token(headers.getlist(FENCING_TOKEN_HEADER))
        if generation is None:
            if self.require_fencing_token:
                raise HeaderError(FENCING_TOKEN_HEADER, "missing_fencing_token", f"{FENCING_TOKEN_HEADER} is required")
            return None
        resource = parse_fencing_resource(headers.getlist(FENCING_RESOURCE_HEADER))
        if resource is None:
            resource = parse_fencing_resource([self.resource_for(HTTPConnection(scope))]) or ""
        return FencingToken(resource, generation)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            key = parse_idempotency_key(headers.getlist(IDEMPOTENCY_KEY_HEADER))
            fence = self._fence(scope, headers)
        except HeaderError as exc:
            await _error(400, exc.code, str(exc), header=exc.header)(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return
        digest = request_hash(scope["method"], scope["path"], scope.get("query_string", b""), body)
        try:
            claim = await self.store.claim(key, digest, fence=fence, now=self._now())
        except StaleFencingTokenError as exc:
            await stale_fencing_response(exc)(scope, receive, send)
            return
        if not isinstance(claim, Claimed):
            if not claim.same_request:
                answer: Response = _error(
                    422, "idempotency_key_reused", f"{IDEMPOTENCY_KEY_HEADER} {key!r} was used with other arguments"
                )
            elif claim.status == KeyStatus.DONE and claim.response is not None:
                answer = _replay(claim.response)
            else:
                answer = _error(409, "idempotency_key_in_flight", f"a request with {key!r} is still executing")
                answer.headers["Retry-After"] = "1"
            await answer(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["idempotency_key"] = key
        state["fencing"] = fence
        await self._execute(claim, scope, _replaying(body, receive), send)

    async def _execute(self, claim: Claimed, scope: Scope, receive: Receive, send: Send) -> None:
        messages: list[Message] = []

        async def capture(message: Message) -> None:
            messages.append(message)

        try:
            await self.app(scope, receive, capture)
            response = _captured(messages)
            if response.status >= 500:
                await self.store.release(claim)
            else:
                await self.store.complete(claim, response, now=self._now())
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.store.release(claim)
            raise
        for message in messages:
            await send(message)
