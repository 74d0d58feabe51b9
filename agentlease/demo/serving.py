"""Serving the example downstream systems on loopback ports chosen by the OS."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.types import ASGIApp

try:
    import uvicorn
except ImportError as _import_error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the demo downstream services need the 'demo' extra: pip install 'agentlease[demo]'"
    ) from _import_error


def bind_loopback() -> socket.socket:
    """A listening TCP socket on 127.0.0.1 with an OS-chosen port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@asynccontextmanager
async def serve_app(app: ASGIApp) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on a loopback port until the block exits; yields its base URL."""
    sock = bind_loopback()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        await task
        sock.close()
