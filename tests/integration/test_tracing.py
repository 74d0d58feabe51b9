"""Tracing on the real dev server: each ledger operation is a span inside Temporal's RunActivity span.

The process's tracer provider is the OpenTelemetry SDK's, with an in-memory exporter; the worker and
the client connect with ``AGENTLEASE_TRACING`` on (``temporalio.contrib.opentelemetry``'s
``TracingInterceptor``). The attempt's trace id is stored on the task and on its evidence-trail
entries, and the CLI shows it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlease.ledger.store import Ledger
from agentlease.observability import tracing
from agentlease.runtime.temporal import connect
from agentlease.settings import AgentLeaseSettings
from agentlease.worker import running_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.integration.test_lease_on_temporal import _plan, opened_ledger
from tests.integration.test_ledger_guards import make_spec

pytestmark = pytest.mark.timeout(120)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans ended while the test runs; tracing is off again afterwards."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_agentlease_test_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        provider._agentlease_test_exporter = True  # type: ignore[attr-defined]
    _EXPORTER.clear()
    try:
        yield _EXPORTER
    finally:
        tracing.disable()
        _EXPORTER.clear()


def _parent(span: ReadableSpan, every: list[ReadableSpan]) -> ReadableSpan | None:
    return next((s for s in every if span.parent is not None and s.context.span_id == span.parent.span_id), None)


def _cli(settings: AgentLeaseSettings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlease.cli.app", "--ledger-url", settings.ledger_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_ledger_operations_are_spans_inside_run_activity_and_the_trace_id_is_stored(
    settings: AgentLeaseSettings, ledger_url: str, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    traced = settings.model_copy(update={"tracing": True, "ledger_url": ledger_url})
    run_id = f"trace-{uuid.uuid4().hex[:8]}"
    plan = _plan(run_id, ("look", "quick", {}))
    async with opened_ledger(traced) as ledger, running_worker(traced, identity="traced-worker"):
        client = await connect(traced)
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=traced.task_queue)
        result = await handle.result()
        assert [t.status.value for t in result.tasks] == ["settled"]
        [record] = await ledger.list_tasks(run_id)
        trail = await ledger.events(record.task_id)

    every = list(spans.get_finished_spans())
    ledger_spans = [s for s in every if s.name.startswith(tracing.SPAN_PREFIX)]
    names = [s.name for s in ledger_spans]
    assert "agentlease.ledger.claim" in names, names
    assert "agentlease.ledger.renew" in names, names
    assert "agentlease.ledger.settle" in names, names
    for span in ledger_spans:
        parent = _parent(span, every)
        assert parent is not None and parent.name == "RunActivity:quick", (span.name, parent and parent.name)
        attributes = dict(span.attributes or {})
        assert attributes["agentlease.task_id"] == record.task_id, attributes
        assert attributes["agentlease.claim_generation"] == 1, attributes
        assert attributes["agentlease.idempotency_key"] == record.idempotency_key, attributes
        assert "agentlease.stage" in attributes, attributes
        assert not any("token" in key for key in attributes), attributes
    stages = {dict(s.attributes or {})["agentlease.stage"] for s in ledger_spans if s.name.endswith("renew")}
    assert stages == {"preflight", "verify"}, stages

    [run_activity] = {s.context.trace_id for s in every if s.name == "RunActivity:quick"}
    trace_id = format(run_activity, "032x")
    assert record.trace.trace_id == trace_id
    assert trail and all(event.trace.trace_id == trace_id for event in trail), trail

    shown = _cli(traced, "events", record.task_id)
    assert shown.returncode == 0, shown
    assert trace_id in shown.stdout, shown.stdout
    listed = _cli(traced, "tasks", "--run", run_id, "--json")
    assert listed.returncode == 0, listed
    assert [t["trace_id"] for t in json.loads(listed.stdout)] == [trace_id]
    table = _cli(traced, "tasks", "--run", run_id)
    assert "trace_id" in table.stdout and trace_id in table.stdout, table.stdout
    # The timeline page (what `agentlease ui` serves and `events --html` writes) shows it too.
    page = tmp_path / "timeline.html"
    written = _cli(traced, "events", record.task_id, "--html", str(page))
    assert written.returncode == 0, written
    assert f"<code id='trace-id'>{trace_id}</code>" in page.read_text()
    assert page.read_text().count(f"<td class='trace-id'>{trace_id}</td>") == len(trail)


async def test_no_span_is_made_while_tracing_is_off(ledger: Ledger, spans: InMemorySpanExporter) -> None:
    assert not tracing.enabled()
    spec = make_spec()
    claim = await ledger.claim(spec, "w1")
    await ledger.renew(claim, reason="still here")
    assert spans.get_finished_spans() == ()
    assert (await ledger.get_task(spec.task_id)).trace.trace_id is None


async def test_a_decision_is_a_span_with_the_decision_kind(ledger: Ledger, spans: InMemorySpanExporter) -> None:
    from agentlease.enums import DecisionKind

    tracing.enable()
    spec = make_spec()
    await ledger.claim(spec, "w1")
    with trace.get_tracer("test").start_as_current_span("operator") as outer:
        record = await ledger.decide(spec.task_id, DecisionKind.CANCEL, by="carol", reason="not needed")
    [span] = [s for s in spans.get_finished_spans() if s.name == "agentlease.ledger.decide"]
    assert span.parent is not None and span.parent.span_id == outer.get_span_context().span_id
    assert dict(span.attributes or {})["agentlease.decision"] == "cancel"
    assert dict(span.attributes or {})["agentlease.claim_generation"] == record.claim_generation
    [cancelled] = [e for e in await ledger.events(spec.task_id) if e.kind.value == "cancelled"]
    assert cancelled.trace.trace_id == format(outer.get_span_context().trace_id, "032x")
