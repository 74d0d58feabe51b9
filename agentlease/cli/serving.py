"""Serving a web app from a command (``agentlease ui``, ``agentlease codec-server``) until a signal, with bounded
clients (``docs/security-operations.md``, "The web view")."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from agentlease.errors import AgentLeaseError, ConfigurationError

if TYPE_CHECKING:
    from agentlease.settings import AgentLeaseSettings

HEADER_TIMEOUT = timedelta(seconds=10)
"""How long a connection may take to send a request's head (request line and headers). Default 10s."""

KEEP_ALIVE = timedelta(seconds=5)
"""How long an idle kept-alive connection stays open. Default 5s."""

MAX_CONNECTIONS = 100
"""Connections (and requests) served at once; more are answered 503 at once."""


@contextmanager
def bound(host: str, port: int) -> Iterator[socket.socket]:
    """A listening socket on ``host:port``, closed on exit; AgentLeaseError when it cannot be bound."""
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

    from agentlease.runtime.shutdown import stop_event

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        http=timed_protocol(HEADER_TIMEOUT),
        timeout_keep_alive=int(KEEP_ALIVE.total_seconds()),
        limit_concurrency=MAX_CONNECTIONS,
    )
    server = uvicorn.Server(config)
    stop = stop_event()
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    announce()
    await asyncio.wait([serving, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving


def timed_protocol(header_timeout: timedelta) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline on each request's head, from the connection's start and again
    after each response; a client too slow is disconnected without an answer (uvicorn has no such deadline)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    seconds = header_timeout.total_seconds()

    class TimedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's head is complete
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # first: a pipelined request handled inside disarms it again
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _too_slow(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol


def serve_ui(settings: AgentLeaseSettings, announce: Callable[[str], None]) -> None:
    """``agentlease ui``: the read-only web view on ``ui_host:ui_port`` until a signal, ``announce``-ing where;
    beyond loopback only with ``AGENTLEASE_UI_TOKEN``.

    Raises:
        ConfigurationError: an address beyond loopback without a token.
        AgentLeaseError: the address cannot be bound.
    """
    from agentlease.cli.session import ledger as open_ledger
    from agentlease.ui.app import ui_app
    from agentlease.ui.guard import host_names, is_loopback

    host, port = settings.ui_host, settings.ui_port
    token = None if settings.ui_token is None else settings.ui_token.get_secret_value()
    local = is_loopback(host)
    if not local and token is None:
        raise ConfigurationError(
            f"agentlease ui serves {host}, beyond this machine, only with AGENTLEASE_UI_TOKEN set (16 characters "
            "or more): the view shows the ledger"
        )
    allowed = host_names(host, settings.ui_allowed_hosts)

    async def _serve(sock: socket.socket) -> None:
        async with open_ledger(settings) as ledger:
            app = ui_app(
                ledger,
                temporal_ui=settings.temporal_ui,
                namespace=settings.namespace,
                token=token,
                allowed_hosts=allowed,
            )
            where = f"http://{host}:{port}/runs/RUN_ID (read-only)"
            line = (
                f"lease timelines on {where}; Ctrl-C stops"
                if local
                else f"warning: lease timelines on {where} are served beyond this machine (every request needs "
                "AGENTLEASE_UI_TOKEN); Ctrl-C stops"
            )
            await serve_until_stopped(app, sock, lambda: announce(line))

    with bound(host, port) as sock:
        asyncio.run(_serve(sock))
