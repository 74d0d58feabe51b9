"""The codec server: ``POST /decode`` and ``/encode`` of Temporal's codec-server JSON for the Temporal UI and CLI,
behind CORS and an optional bearer token, bodies within :data:`MAX_BODY_BYTES` and :data:`BODY_TIMEOUT`.
``docs/security-data.md`` ("Transport and payload encryption")."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Sequence
from datetime import timedelta

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

from agentlease.errors import AgentLeaseError
from agentlease.limits import is_decimal

MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body the codec server reads (a history page's payloads). 8 MiB."""

BODY_TIMEOUT = timedelta(seconds=30)
"""How long a request's body may take to arrive. Default 30s."""


class _BodyRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request: Request, *, limit: int = MAX_BODY_BYTES, timeout: timedelta = BODY_TIMEOUT) -> bytes:
    """The request's body, never more than ``limit`` bytes kept nor longer than ``timeout``; else _BodyRefused
    (413 over the limit, 408 too slow, 400 the client went away)."""
    length = request.headers.get("content-length", "")
    if is_decimal(length) and int(length) > limit:
        raise _BodyRefused(413, f"body over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout.total_seconds()):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _BodyRefused(413, f"body over {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise _BodyRefused(408, f"the body did not arrive within {timeout.total_seconds():g}s") from None
    except ClientDisconnect:
        raise _BodyRefused(400, "the client went away") from None
    return b"".join(chunks)


def codec_app(
    codec: PayloadCodec,
    *,
    token: str | None = None,
    origins: Sequence[str] = (),
    body_timeout: timedelta = BODY_TIMEOUT,
) -> Starlette:
    """The codec server's ASGI app for ``codec`` (the workers' own), requiring ``token`` as a bearer token unless
    ``None``, allowing CORS from ``origins`` (e.g. ``http://localhost:8233``) and bodies within ``body_timeout``."""

    def allowed(request: Request) -> bool:
        if token is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def endpoint(decode: bool) -> object:
        async def handle(request: Request) -> Response:
            if not allowed(request):
                return JSONResponse({"message": "a valid bearer token is required"}, status_code=401)
            try:
                body = await read_body(request, timeout=body_timeout)
            except _BodyRefused as exc:
                return JSONResponse({"message": str(exc)}, status_code=exc.status)
            payloads = Payloads()
            try:
                json_format.Parse(body or b"{}", payloads)
            except (json_format.ParseError, DecodeError, UnicodeDecodeError) as exc:
                return JSONResponse({"message": f"not Temporal payloads JSON: {exc}"}, status_code=400)
            try:
                done = await (codec.decode if decode else codec.encode)(list(payloads.payloads))
            except AgentLeaseError as exc:
                return JSONResponse({"message": str(exc)}, status_code=400)
            return Response(json_format.MessageToJson(Payloads(payloads=done)), media_type="application/json")

        return handle

    return Starlette(
        routes=[
            Route("/decode", endpoint(True), methods=["POST"]),  # type: ignore[arg-type]
            Route("/encode", endpoint(False), methods=["POST"]),  # type: ignore[arg-type]
        ],
        middleware=[
            Middleware(
                CORSMiddleware,
                allow_origins=list(origins),
                allow_methods=["POST"],
                allow_headers=["Content-Type", "X-Namespace", "Authorization"],
                allow_credentials=True,
            )
        ],
    )


__all__ = ["BODY_TIMEOUT", "MAX_BODY_BYTES", "codec_app", "read_body"]
