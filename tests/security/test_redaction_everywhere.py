"""Finding 4 of issue 21 (and the redaction misses among its low items): no secret leaves raw, whatever
its shape and whichever way out.

The shapes (:func:`shapes`): values under secret-looking keys of dicts (``api_key``, ``password``,
``client_secret``, ``token``, ``authorization``, ``cookie``, ``secret``, ``X-Api-Key``,
``refreshToken``, nested), a URL password with ``/`` in it, ``token <value>``, GitHub ``ghp_`` and
Stripe ``sk_live_`` tokens, ``Cookie: session=...``, ``Authorization: Bearer``, ``password=``, JSON
text. The ways out: the redactor itself (hypothesis, many cases); the ledger's rows as the worker
writes them (hypothesis, a real SQLite ledger per case: renewal reasons, receipts, results kept with a
refused settle, lease-end errors, decision details); and one run on the real dev server with a worker
whose tool puts every shape everywhere, read back through Temporal's raw history (outputs, receipts,
failures, heartbeats and progress signals), ``agentlease status``, ``tasks --json``, ``events --json``,
``events --html`` and the web view's pages and JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.engine import Connection
from temporalio.client import Client

from agentlease.demo.serving import serve_app
from agentlease.enums import DecisionKind, ErrorClass, SideEffectClass, Stage
from agentlease.errors import LeaseLostError
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, RunStatus, SettlementReceipt, TaskSpec
from agentlease.runtime.temporal import connect
from agentlease.security.redaction import redact_value
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.ui.app import ui_app
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.security.edge_cli import agentlease
from tests.security.test_codec import readable

pytestmark = pytest.mark.timeout(300)

secrets_ = st.text(alphabet="abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=16, max_size=40).map(
    lambda s: f"Q7{s}"  # a prefix no rule and no surrounding text makes: the secret is unmistakable
)
SECRET_KEYS = (
    "api_key",
    "password",
    "client_secret",
    "token",
    "access_token",
    "refreshToken",
    "authorization",
    "Cookie",
    "secret",
    "X-Api-Key",
    "private_key",
    "db_password",
)


def shapes(secret: str) -> tuple[str, dict[str, Any]]:
    """Every shape of ``secret``: as text (one string holding each text shape) and as data (dicts)."""
    slashed = f"{secret[:6]}/{secret[6:]}"
    text_shapes = " | ".join(
        [
            f"GET https://bot:{slashed}@api.example.com/x failed",
            f"retry with token {secret}",
            f"github ghp_{secret}",
            f"stripe sk_live_{secret}",
            f"Cookie: session={secret}; theme=dark",
            f"Authorization: Bearer {secret}",
            f"login password={secret}&user=x",
            json.dumps({"api_key": secret}),
        ]
    )
    data: dict[str, Any] = dict.fromkeys(SECRET_KEYS, secret)
    data["nested"] = {"credentials": {"user": "bot", "password": secret}, "list": [{"token": secret}]}
    return text_shapes, data


def leaked(secret: str, *shown: str) -> bool:
    """Whether any part of ``secret`` long enough to matter (its tail after a ``/``, too) is in ``shown``."""
    parts = (secret, secret[6:], secret[:6] + "/")
    return any(part in item for item in shown for part in parts if len(part) >= 8)


@settings(max_examples=300, deadline=None)
@given(secret=secrets_, key=st.sampled_from(SECRET_KEYS), depth=st.integers(min_value=0, max_value=4))
def test_the_redactor_masks_every_shape(secret: str, key: str, depth: int) -> None:
    text_shapes, data = shapes(secret)
    nested: Any = {key: secret, "fine": "hello world"}
    for _ in range(depth):
        nested = {"wrapped": [nested]}
    masked = redact_value({"text": text_shapes, "data": data, "nested": nested})
    dumped = json.dumps(masked)
    assert not leaked(secret, dumped), dumped
    assert "hello world" in dumped and "api.example.com" in dumped  # what is not a secret stays


def _spec(step: str) -> TaskSpec:
    return TaskSpec(
        task_id=f"run-r/{step}",
        agent_run_id="run-r",
        step_id=step,
        tool="leak_secrets",
        side_effect_class=SideEffectClass.READ_ONLY,
        idempotency_key=f"run-r:{step}",
        lease_ttl=timedelta(minutes=1),
    )


async def _through_the_ledger(url: str, secret: str) -> str:
    """Every write a worker makes, each carrying the secret's shapes; then every row, as text."""
    text_shapes, data = shapes(secret)
    ledger = Ledger.from_url(url)
    try:
        await upgrade(ledger.database)
        receipt = SettlementReceipt(
            external_system="leak", external_id="x", status="done", details=data, verified_at=datetime.now(UTC)
        )
        claim = await ledger.claim(_spec("settled"), "worker")
        await ledger.renew(claim, reason=text_shapes, stage=Stage.EXTERNAL_CALL)
        await ledger.settle(claim, receipt, result={"output": data, "text": text_shapes})
        with contextlib.suppress(LeaseLostError):  # refused: kept as late_unapplied evidence, with its result
            await ledger.settle(claim, receipt, result={"output": data, "text": text_shapes})
        failed = await ledger.claim(_spec("failed"), "worker")
        await ledger.release(failed, error_class=ErrorClass.RETRYABLE, error=text_shapes, details=data)
        again = await ledger.claim(_spec("failed"), "worker")
        await ledger.dead_letter(again, error_class=ErrorClass.PERMANENT, error=text_shapes)
        await ledger.decide("run-r/failed", DecisionKind.REDRIVE, by="alice", reason=text_shapes, details=data)

        def dump(conn: Connection) -> str:
            return "\n".join(
                repr(tuple(row))
                for table in ("tasks", "lease_events", "receipts")
                for row in conn.execute(text(f"SELECT * FROM {table}"))
            )

        return await ledger.database.read(dump)
    finally:
        await ledger.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=secrets_)
def test_no_shape_reaches_a_row_of_the_ledger(secret: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        rows = asyncio.run(_through_the_ledger(f"sqlite:///{Path(directory) / 'ledger.db'}", secret))
    assert "leak" in rows and "run-r/settled" in rows  # the rows are there
    assert not leaked(secret, rows), rows


ARGUMENTS_IN = ("workflowExecutionStartedEventAttributes", "activityTaskScheduledEventAttributes")
"""History events that carry a call's arguments in (they travel encrypted with the codec): not a way out."""


async def _history_out(temporal_address: str, run_id: str) -> str:
    """What the run's history holds besides its inputs: tool outputs and receipts, failures, heartbeat
    details, progress signals, update and query answers (as stored, read without any codec)."""
    raw = await Client.connect(temporal_address)
    events = (await raw.get_workflow_handle(run_id).fetch_history()).to_json_dict()["events"]
    kept = [event for event in events if not any(attributes in event for attributes in ARGUMENTS_IN)]
    assert len(kept) < len(events)
    return readable(kept)


@contextlib.contextmanager
def _html_export(run_id: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory) / f"{run_id}.html"


async def test_no_shape_leaves_a_run_by_any_way_out(client: Client, settings: AgentLeaseSettings) -> None:
    secret = f"Q7{uuid.uuid4().hex}"
    text_shapes, data = shapes(secret)
    run_id = f"leak-{uuid.uuid4().hex[:8]}"
    registry = load_registry(["tests.security.round2_tools"])
    worker_client = await connect(settings, identity="leak-worker")
    plan = AgentRunPlan(
        agent_run_id=run_id,
        steps=[
            PlanStep(step_id="ok", tool="leak_secrets", arguments={"text": text_shapes, "data": data}),
            PlanStep(step_id="bad", tool="leak_secrets", arguments={"text": text_shapes, "data": data, "fail": True}),
        ],
    )
    ledger = Ledger.from_url(settings.ledger_url)
    await upgrade(ledger.database)
    try:
        async with build_worker(worker_client, ledger, registry, settings, identity="leak-w"):
            handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

            async def both_ended() -> RunStatus:
                status = await handle.query("status", result_type=RunStatus)
                assert [t.status for t in status.tasks] == ["settled", "dead_lettered"], status
                return status

            result = await assert_eventually(both_ended, timeout=90, message="one step settled, one dead-lettered")
            env = {
                "AGENTLEASE_TEMPORAL_ADDRESS": settings.temporal_address,
                "AGENTLEASE_LEDGER_URL": settings.ledger_url,
            }
            with _html_export(run_id) as page:
                outputs = [
                    await agentlease(*args, env=env)
                    for args in (
                        ("status", run_id, "--json"),
                        ("status", run_id),
                        ("tasks", "--run", run_id, "--json"),
                        ("events", "--run", run_id, "--json"),
                        ("events", "--run", run_id, "--html", str(page)),
                        ("waiting",),
                    )
                ]
                shown = [o.stdout + o.stderr for o in outputs] + [page.read_text()]
            assert [(o.args[3:], o.returncode) for o in outputs if o.returncode != 0] == [], [o.stderr for o in outputs]
            async with serve_app(ui_app(ledger)) as base, httpx.AsyncClient(base_url=base.rstrip("/")) as http:
                task_ids = [f"{run_id}/ok", f"{run_id}/bad"]
                pages = [await http.get(f"/runs/{run_id}"), await http.get(f"/api/runs/{run_id}/tasks")]
                for task_id in task_ids:
                    pages += [
                        await http.get(f"/tasks/{task_id}"),
                        await http.get(f"/api/tasks/{task_id}"),
                        await http.get(f"/api/events/{task_id}"),
                    ]
            await handle.cancel()
        assert all(p.status_code == 200 for p in pages), pages
        shown += [p.text for p in pages]
        shown.append(await _history_out(settings.temporal_address, run_id))
        shown.append(result.model_dump_json())
        shown.append(json.dumps([e.model_dump(mode="json") for e in await ledger.events(agent_run_id=run_id)]))
        assert "api.example.com" in shown[0]  # what the run shows is there, masked
        for item in shown:
            assert not leaked(secret, item), item
    finally:
        await ledger.close()
