"""`agentlease ui` as a user runs it: serves the ledger read-only, refuses a port in use in one line,
stops on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable

import httpx

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from tests.eventually import assert_eventually_sync
from tests.integration.test_ui import takeover

from .runner import Background, Cli
from .test_cli import FAILED, assert_one_error_line, free_port


async def fill(url: str) -> str:
    ledger = Ledger.from_url(url)
    try:
        await upgrade(ledger.database)
        return (await takeover(ledger)).task_id
    finally:
        await ledger.close()


def test_ui_serves_the_timeline_and_stops_on_sigterm(cli: Cli, background: Callable[..., Background]) -> None:
    url = f"sqlite:///{cli.cwd / 'ledger.db'}"
    task_id = asyncio.run(fill(url))
    port = free_port()
    ui = background(
        "ui", "--port", str(port), "--temporal-ui", "http://127.0.0.1:8233", env={"AGENTLEASE_LEDGER_URL": url}
    )
    ui.wait_for_line("lease timelines on", timeout=30)

    def page() -> httpx.Response:
        response = httpx.get(f"http://127.0.0.1:{port}/tasks/{task_id}", timeout=5)
        assert response.status_code == 200
        return response

    shown = assert_eventually_sync(page, timeout=30, message="the timeline is served")
    assert "generation 2" in shown.text and "late_unapplied" in shown.text
    assert ui.stop(signal.SIGTERM) == 0, "".join(ui.stderr)


def test_ui_on_a_port_in_use_is_one_line(cli: Cli) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = {"AGENTLEASE_LEDGER_URL": f"sqlite:///{cli.cwd / 'ledger.db'}"}
        assert cli("db", "upgrade", env=env).returncode == 0
        assert_one_error_line(cli("ui", "--port", str(port), env=env), FAILED, f"cannot serve on 127.0.0.1:{port}")


def test_dev_on_a_port_in_use_is_one_line_at_once(cli: Cli) -> None:
    # The dev server would otherwise wait out its whole start (a minute) before failing.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = cli("dev", "--port", str(port))
        assert_one_error_line(result, FAILED, f"port {port} on 127.0.0.1 is in use")
