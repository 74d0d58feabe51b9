"""ASGI middleware enforcing idempotency keys and fencing tokens at a downstream service.

The HTTP convention (what agentlease tools send, what the service answers):

Requests
    ``POST``, ``PUT``, ``PATCH`` and ``DELETE`` carry ``Idempotency-Key`` (1 to 255 printable ASCII
    characters, bare or as a quoted structured-field string). A fenced write also carries
    ``Fencing-Token``: the claim generation of the writer's lease, a decimal integer, or with a
    fencing key ``<generation>.<signature>`` (:func:`~agentlease.fencing.sign_fencing_token`). The
    fenced resource is named by the service's ``resource_for(request)`` function (its route
    configuration), by default the request path (``/articles/42``); a client's ``Fencing-Resource``
    header is ignored unless the service opts in (``client_named_resource=True``, and its handler then
    checks the resource is the one it writes). Every other method (``GET``, ``HEAD``, ``OPTIONS``)
    passes through untouched.

Callers (``docs/security.md``, "Fencing tokens a downstream can verify")
    Keys are scoped per caller: ``caller_for(request)`` names the caller (by default a digest of the
    ``Authorization`` or ``X-API-Key`` header; requests with neither share one anonymous scope), and
    a stored response is replayed only to the caller that made it. A stored response never keeps
    ``Set-Cookie``: the first answer carries its cookies, a replay none. A body larger than
    ``max_body_bytes`` (default 1 MiB) is answered 413 ``request_too_large`` before anything is stored.

Answers, in the order they are decided
    - 413 ``request_too_large``: the body is larger than ``max_body_bytes``; 408 ``request_timeout``:
      it did not arrive within ``body_timeout_s``.
    - 400 ``missing_idempotency_key`` / ``invalid_idempotency_key`` / ``invalid_fencing_token`` /
      ``invalid_fencing_resource`` / ``repeated_*``: a malformed convention header. With
      ``require_fencing_token=True`` a missing token is 400 ``missing_fencing_token``. With a
      ``fencing_key``, an unsigned token or one whose signature does not verify for the resource
      is 400 ``invalid_fencing_token`` (an invented huge generation never reaches the fence).
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

import hashlib
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
from agentlease.fencing import FencingToken, verify_fencing_token
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
    raw_fencing_token,
    request_hash,
)
from agentlease.idempotency.store import Claimed, IdempotencyStore, KeyStatus, StoredResponse


def request_path(connection: HTTPConnection) -> str:
    """The default ``resource_for``: the request's path."""
    return connection.url.path


MAX_BODY_BYTES = 1024 * 1024
"""Default largest request body the middleware reads (1 MiB); a larger one is answered 413."""

BODY_TIMEOUT_S = 30.0
"""Default seconds a request's body may take to arrive; a slower one is answered 408."""


def caller_from_credentials(connection: HTTPConnection) -> str:
    """The default ``caller_for``: the request's ``Authorization`` (or else ``X-API-Key``) header value,
    ``""`` (the anonymous scope) when it has neither. The middleware stores only a digest of it.

    An ``Authorization`` value is taken as the server reads it: its scheme is case-insensitive and
    the spaces around and after it do not count (``Bearer x``, ``bearer  x`` and ``BEARER x`` are
    one caller); the credentials themselves compare exactly.
    """
    headers = connection.headers
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, credentials = authorization.strip().partition(" ")
        return f"{scheme.lower()} {credentials.strip()}" if credentials.strip() else scheme.lower()
    return headers.get("x-api-key") or ""


def scoped_key(caller: str, key: str) -> str:
    """The stored form of ``key`` for ``caller``: ``<16 hex of the caller's digest>:<key>``, or a digest
    of both when that would not fit the store's column."""
    tag = hashlib.sha256(caller.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    scoped = f"{tag}:{key}"
    if len(scoped) <= 255:
        return scoped
    return "sha256:" + hashlib.sha256(f"{caller}\n{key}".encode("utf-8", "surrogatepass")).hexdigest()


class _TooLarge(Exception):
    """The request body outgrew ``max_body_bytes``."""


class _TooSlow(Exception):
    """The request body did not arrive within ``body_timeout_s``."""


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


async def _read_body(receive: Receive, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes | None:
    """The whole request body, or ``None`` if the client disconnected first.

    Raises:
        _TooLarge: the body is larger than ``limit`` bytes (reading stops there).
        _TooSlow: the body did not arrive within ``timeout_s`` seconds.
    """
    try:
        with anyio.fail_after(timeout_s):
            return await _read_all(receive, limit)
    except TimeoutError:
        raise _TooSlow from None


async def _read_all(receive: Receive, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
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
    # A replay never sets the first caller's cookies again.
    headers = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in start.get("headers", [])
        if name.lower() != b"set-cookie"
    ]
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
        resource_for: names the fenced resource of a request (the service's route
            configuration). Default :func:`request_path`.
        require_fencing_token: answer 400 to a mutating request without ``Fencing-Token``.
            Default ``False`` (idempotent-only clients send just the key).
        fencing_key: the shared fencing key (``AGENTLEASE_FENCING_KEY``): only signed tokens that
            verify for the request's resource pass. Default ``None``: bare generations are taken.
        caller_for: names the caller a key is scoped to. Default :func:`caller_from_credentials`.
        client_named_resource: take the resource from the client's ``Fencing-Resource`` header when
            present (the handler must check it is the one it writes). Default ``False``: the header
            is ignored.
        max_body_bytes: the largest body read; larger is 413. Default :data:`MAX_BODY_BYTES`.
        body_timeout_s: seconds the body may take to arrive; slower is 408 ``request_timeout``
            (a client trickling its body holds nothing longer). Default :data:`BODY_TIMEOUT_S`. A
            client slow to send its headers is the server's to cut off (uvicorn has no such limit:
            ``agentlease.cli.serving.timed_protocol`` adds one).
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
        fencing_key: bytes | str | None = None,
        caller_for: Callable[[HTTPConnection], str] = caller_from_credentials,
        client_named_resource: bool = False,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.store = store
        self.resource_for = resource_for
        self.require_fencing_token = require_fencing_token
        self.clock = clock
        self.fencing_key = fencing_key.encode("utf-8") if isinstance(fencing_key, str) else fencing_key
        self.caller_for = caller_for
        self.client_named_resource = client_named_resource
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    def _now(self) -> datetime | None:
        return None if self.clock is None else self.clock()

    def _fence(self, scope: Scope, headers: Headers) -> FencingToken | None:
        raw = raw_fencing_token(headers.getlist(FENCING_TOKEN_HEADER))
        if raw is None:
            if self.require_fencing_token:
                raise HeaderError(FENCING_TOKEN_HEADER, "missing_fencing_token", f"{FENCING_TOKEN_HEADER} is required")
            return None
        named = parse_fencing_resource(headers.getlist(FENCING_RESOURCE_HEADER))
        resource = named if self.client_named_resource and named is not None else None
        if resource is None:
            resource = parse_fencing_resource([self.resource_for(HTTPConnection(scope))]) or ""
        if self.fencing_key is None:
            generation = parse_fencing_token([raw.partition(".")[0]])
            assert generation is not None
            return FencingToken(resource, generation)
        try:
            return FencingToken(resource, verify_fencing_token(self.fencing_key, resource, raw))
        except InvalidFencingTokenError as exc:
            raise HeaderError(FENCING_TOKEN_HEADER, "invalid_fencing_token", str(exc)) from None

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
        too_large = _error(413, "request_too_large", f"the request body is larger than {self.max_body_bytes} bytes")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
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
        stored_key = scoped_key(self.caller_for(HTTPConnection(scope)), key)
        try:
            claim = await self.store.claim(stored_key, digest, fence=fence, now=self._now())
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
