"""Redaction (finding 7): an ``http_get`` of ``http://admin:hunter2@...`` leaves the password nowhere in
the ledger (evidence, last error, receipts) nor in what the run reports; ``agentlease dev`` masks
the ledger URL's password."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection
from temporalio.client import Client

from agentlease.decisions.table import CancelRequest
from agentlease.ledger.store import Ledger
from agentlease.records import RunStatus
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.runner import Background, Cli
from tests.acceptance.test_cli import free_port
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

pytestmark = pytest.mark.timeout(240)

SECRET = "hunter2"


class _Files(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/doc":
            body = b"the document"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@contextlib.contextmanager
def file_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def _ledger_text(ledger: Ledger) -> str:
    """Every row of the ledger's tables, as text."""

    def dump(conn: Connection) -> str:
        rows = []
        for table in ("tasks", "lease_events", "receipts"):
            rows += [repr(tuple(row)) for row in conn.execute(text(f"SELECT * FROM {table}"))]
        return "\n".join(rows)

    return await ledger.database.read(dump)


async def test_http_get_with_a_password_in_the_url_leaves_it_nowhere(
    client: Client, settings: AgentLeaseSettings
) -> None:
    run_id = f"redact-{uuid.uuid4().hex[:8]}"
    with file_server() as port:
        base = f"http://127.0.0.1:{port}/"
        settings = settings.model_copy(update={"http_base_url": base})
        plan = _plan(
            run_id,
            ("ok", "http_get", {"url": f"http://admin:{SECRET}@127.0.0.1:{port}/doc"}),
            ("missing", "http_get", {"url": f"http://admin:{SECRET}@127.0.0.1:{port}/missing"}),
        )
        async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-redact"):
            handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

            # Tool authority refuses a URL with credentials before it is fetched (dead-lettered with
            # the reason); what the run, the ledger and its trail keep of it must not hold the password.
            async def dead_lettered() -> RunStatus:
                status = await handle.query("status", result_type=RunStatus)
                assert [t.status for t in status.tasks] == ["dead_lettered", "pending"], status
                return status

            status = await assert_eventually(dead_lettered, timeout=60, message="the first step is dead-lettered")
            stored = await _ledger_text(ledger)
            assert "credentials in the URL" in stored, stored
            assert SECRET not in stored
            assert SECRET not in status.model_dump_json()  # what `agentlease status` shows
            await handle.execute_update("cancel", CancelRequest(by="test", reason="done"))


def test_the_default_redactor() -> None:
    from agentlease.security.redaction import redact_text, redact_value

    cases = {
        "GET https://bob:s3cr3t-pw@api.example.com/x failed": "GET https://bob:***@api.example.com/x failed",
        "postgresql://agent:p%40ss@db:5432/ledger": "postgresql://agent:***@db:5432/ledger",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig": "Authorization: ***",
        "sent with bearer abcdefghijklmnop": "sent with bearer ***",
        "login password=hunter2&user=x": "login password=***&user=x",
        '{"api_key": "sk-live-123456"}': '{"api_key": "***"}',
        "key AKIAIOSFODNN7EXAMPLE in use": "key *** in use",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY": "aws_secret_access_key = ***",
        "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----": "***",
        "nothing secret at https://example.com/a?b=c": "nothing secret at https://example.com/a?b=c",
        # a secret after another word's "name:" or "name=" (exception text has this shape)
        "Error: token=abc123def456": "Error: token=***",
        "x: api_key=sk_live_abcdefgh": "x: api_key=***",
        "RuntimeError: probe failed: password=hunter2": "RuntimeError: probe failed: password=***",
        "a=b:secret=c1d2e3": "a=b:secret=***",
        "state: open, reason: client_secret=abc": "state: open, reason: client_secret=***",
    }
    for given, expected in cases.items():
        assert redact_text(given) == expected, given
    nested = redact_value({"a": ["token=abc123"], "n": 3, "ok": True, "none": None})
    assert nested == {"a": ["token=***"], "n": 3, "ok": True, "none": None}


def custom_redactor(value: str) -> str:
    """A deployment's own redactor (``AGENTLEASE_REDACTOR``): the default, plus its ticket ids."""
    from agentlease.security.redaction import redact_text

    return redact_text(value).replace("TICKET-42", "TICKET-?")


async def test_a_configured_redactor_applies_to_what_the_ledger_stores(ledger: Ledger) -> None:
    from datetime import timedelta

    from agentlease.enums import SideEffectClass
    from agentlease.plugin import AgentLeasePlugin
    from agentlease.records import TaskSpec
    from agentlease.security.redaction import configure

    AgentLeasePlugin(
        settings=AgentLeaseSettings(redactor="tests.security.test_redaction:custom_redactor"), ledger=ledger
    )
    try:
        spec = TaskSpec(
            task_id="r/1",
            agent_run_id="r",
            step_id="1",
            tool="t",
            side_effect_class=SideEffectClass.IDEMPOTENT,
            idempotency_key="r:1",
            lease_ttl=timedelta(seconds=30),
        )
        claim = await ledger.claim(spec, owner="w", heartbeat_timeout=timedelta(seconds=30))
        await ledger.renew(claim, reason="working on TICKET-42 with password=pw1")
        stored = await _ledger_text(ledger)
        assert "TICKET-?" in stored and "TICKET-42" not in stored and "pw1" not in stored
    finally:
        configure(None)


@pytest.mark.postgres
async def test_dev_masks_the_ledger_password(pg_url: str, tmp_path: Path) -> None:
    secret_url = pg_url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")
    assert SECRET in secret_url
    cli = Cli(cwd=tmp_path, data_dir=tmp_path / "data")
    env = {"AGENTLEASE_LEDGER_URL": secret_url}
    dev = Background(cli, "dev", "--port", str(free_port()), "--ui-port", str(free_port()), env=env)
    try:
        await asyncio.to_thread(dev.wait_for_line, "Ctrl-C stops everything", timeout=180)
        printed = "\n".join(dev.stderr)
        assert "postgres:***@" in printed, printed
        assert SECRET not in printed, printed
    finally:
        await asyncio.to_thread(dev.stop)
    assert json.dumps(dev.stderr).count(SECRET) == 0
