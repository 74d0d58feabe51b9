"""``agentlease run --wait`` while the Temporal server restarts: following goes on once it is back,
and the command ends as the run does, with no traceback (``docs/security-input.md``, "Hostile input")."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentlease.observability import search_attributes
from agentlease.runtime.devserver import temporal_binary
from tests.acceptance.conftest import background, cli, write_file  # noqa: F401
from tests.acceptance.runner import Background, Cli, WriteFile
from tests.acceptance.test_cli import free_port
from tests.eventually import assert_eventually_sync

pytestmark = pytest.mark.timeout(240)

DOWN_S = 15.0
"""How long the server stays down: longer than the SDK's own retries of one call (10 s)."""

TOOLS = '''
import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel

from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.enums import SideEffectClass, Stage
from agentlease.records import SettlementReceipt


class GateArgs(BaseModel):
    gate: str


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=30))
async def wait_for_file(ctx: LeaseContext, args: GateArgs) -> ToolResult:
    """Renews its lease until the file ``gate`` exists, then settles."""
    await ctx.advance(Stage.PREFLIGHT, "waiting for the gate file")
    while not Path(args.gate).exists():
        try:
            await ctx.renew("gate file not there yet")
        except Exception:  # Temporal restarting: the heartbeat is buffered, the ledger renewal stands
            pass
        await asyncio.sleep(0.2)
    await ctx.advance(Stage.VERIFY, "gate file found")
    now = datetime.now(UTC)
    receipt = SettlementReceipt(external_system="gate", external_id=args.gate, status="open", verified_at=now)
    return ToolResult(receipt=receipt)
'''


def _server(port: int, db: Path) -> subprocess.Popen[bytes]:
    args = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless"]
    args += ["--db-filename", str(db), "--log-level", "error"]
    args += search_attributes.dev_server_flags()
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Callable[..., None]]:
    """A Temporal dev server of this test's own on a SQLite file; ``restart()`` stops and starts it."""
    port, db = free_port(), tmp_path / "temporal.db"
    servers = [_server(port, db)]
    assert_eventually_sync(lambda: _answers(port), timeout=60, message="the server answers")

    def restart(while_down: Callable[[], None] = lambda: None) -> None:
        servers[-1].send_signal(signal.SIGTERM)
        servers[-1].wait(timeout=60)
        while_down()
        servers.append(_server(port, db))
        assert_eventually_sync(lambda: _answers(port), timeout=60, message="the server answers again")

    restart.port = port  # type: ignore[attr-defined]
    yield restart
    for server in servers:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_run_wait_follows_a_run_across_a_temporal_restart(
    cli: Cli,  # noqa: F811
    write_file: WriteFile,  # noqa: F811
    background: Callable[..., Background],  # noqa: F811
    restartable: Callable[..., None],
    tmp_path: Path,
) -> None:
    write_file("gate_tools.py", TOOLS)
    gate = tmp_path / "gate"
    plan = {"steps": [{"step_id": "wait", "tool": "wait_for_file", "arguments": {"gate": str(gate)}}]}
    write_file("plan.json", json.dumps(plan))
    env = {
        "AGENTLEASE_TEMPORAL_ADDRESS": f"127.0.0.1:{restartable.port}",  # type: ignore[attr-defined]
        "AGENTLEASE_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
        "AGENTLEASE_MIGRATE_ON_START": "true",
        "AGENTLEASE_TOOL_MODULES": "gate_tools",
        "PYTHONPATH": str(cli.cwd),
    }
    worker = background("worker", env=env)
    worker.wait_for_line("worker on", timeout=60)
    follower = background("run", "plan.json", "--wait", "--json", "--run-id", "across-restart", env=env, stdout=True)

    def running() -> bool:
        shown = cli("status", "across-restart", "--json", env=env)
        return shown.returncode == 0 and json.loads(shown.stdout)["tasks"][0]["status"] == "running"

    assert_eventually_sync(running, timeout=60, interval=0.5, message="the step runs")

    def outlasts_the_sdk_retries() -> None:
        """Down longer than the SDK retries one call (10 s): the follower must still be following."""
        with pytest.raises(subprocess.TimeoutExpired):
            follower.process.wait(timeout=DOWN_S)

    restartable(outlasts_the_sdk_retries)
    gate.write_text("open")
    code = follower.process.wait(timeout=120)
    follower.stop()
    stderr = "".join(follower.stderr)
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
