"""The codec server: decrypted payloads for the Temporal UI and the ``temporal`` CLI, for those allowed.

``POST /decode`` and ``POST /encode`` take and return Temporal's codec-server JSON: a
``Payloads`` message in protobuf JSON, ``{"payloads": [{"metadata": {"encoding": "<base64>", ...},
"data": "<base64>"}]}``. The Temporal UI calls it from the browser (its "Codec Server" setting, or
``temporal server start-dev --ui-codec-endpoint``), so CORS admits the configured origins; the
``temporal`` CLI calls it with ``--codec-endpoint`` (and ``--codec-auth``). With a token configured,
a request without ``Authorization: Bearer <token>`` gets 401 and sees nothing decrypted.
``docs/security.md`` ("Transport and payload encryption") shows the setup.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

from agentlease.errors import AgentLeaseError

_MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body the codec server reads (a history page's payloads). 8 MiB."""


def codec_app(codec: PayloadCodec, *, token: str | None = None, origins: Sequence[str] = ()) -> Starlette:
    """The codec server's ASGI app.

    Args:
        codec: the codec (the workers' own, :func:`agentlease.temporal.payload_codec`).
        token: the bearer token a request must carry; ``None``: none required.
        origins: browser origins allowed by CORS (the Temporal UI's, ``http://localhost:8233``).
    """

    def allowed(request: Request) -> bool:
        if token is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def endpoint(decode: bool) -> object:
        async def handle(request: Request) -> Response:
            if not allowed(request):
                return JSONResponse({"message": "a valid bearer token is required"}, status_code=401)
            body = await request.body()
            if len(body) > _MAX_BODY_BYTES:
                return JSONResponse({"message": f"body over {_MAX_BODY_BYTES} bytes"}, status_code=413)
            payloads = Payloads()
            try:
                json_format.Parse(body or b"{}", payloads)
            except (json_format.ParseError, DecodeError, UnicodeDecodeError) as exc:
                return JSONResponse({"message": f"not Temporal payloads JSON: {exc}"}, status_code=400)
            try:
                done = await (codec.decode if decode else codec.encode)(list(payloads.payloads))
            except AgentLeaseError as exc:
                return JSONResponse({"message": str(exc)}, status_code=400)
            return Response(
                json_format.MessageToJson(Payloads(payloads=done)),
                media_type="application/json",
            )

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


__all__ = ["codec_app"]
