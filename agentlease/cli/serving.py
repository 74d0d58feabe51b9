"""Serving a web app from a command (``agentlease ui``, ``agentlease codec-server``) until a signal."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agentlease.errors import AgentLeaseError


@contextmanager
def bound(host: str, port: int) -> Iterator[socket.socket]:
    """A listening socket on ``host:port``, bound before anything else starts, closed on exit.

    Raises:
        AgentLeaseError: the address cannot be bound (in use, not this host's), in one line.
    """
    try:
        sock = socket.create_server((host, port))
    except OSError as exc:
        raise AgentLeaseError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    try:
        yield sock
    finally:
        sock.close()


async def serve_until_stopped(app: Any, sock: socket.socket, announce: Callable[[], None]) -> None:
    """Serve the ASGI ``app`` on ``sock`` (uvicorn, warnings only) until SIGINT, SIGTERM or SIGHUP;
    ``announce`` prints where, once serving has started."""
    try:
        import uvicorn
    except ImportError as exc:  # agentlease ui and codec-server check first (require_extra)
        raise ImportError("serving a web app needs the 'ui' extra: pip install 'agentlease[ui]'") from exc

    from agentlease.shutdown import stop_event

    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    stop = stop_event()
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    announce()
    await asyncio.wait([serving, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
