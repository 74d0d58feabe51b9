"""A worker's metrics endpoint on the real dev server: the lease metrics carry the worker's namespace and
task queue (so they join Temporal's runtime metrics), and Temporal's runtime metrics are served on the
same endpoint."""

from __future__ import annotations

import socket
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentlease.runtime.temporal import connect
from agentlease.settings import AgentLeaseSettings
from agentlease.worker import running_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import _plan

pytestmark = pytest.mark.timeout(120)


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


async def _samples(address: str) -> list[tuple[str, dict[str, str], float]]:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://{address}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    ]


async def test_lease_metrics_carry_namespace_and_task_queue_beside_temporal_runtime_metrics(
    settings: AgentLeaseSettings,
) -> None:
    address = _free_address()
    served = settings.model_copy(update={"metrics_address": address, "migrate_on_start": True})
    run_id = f"labels-{uuid.uuid4().hex[:8]}"
    async with running_worker(served, identity="labelled-worker"):
        client = await connect(served)
        await client.execute_workflow(
            AgentRunWorkflow.run, _plan(run_id, ("look", "quick", {})), id=run_id, task_queue=served.task_queue
        )

        async def both_kinds() -> None:
            samples = await _samples(address)
            granted = [
                labels
                for name, labels, value in samples
                if name == "agentlease_lease_claims_total" and labels.get("tool") == "quick" and value >= 1
            ]
            assert {"namespace": served.namespace, "task_queue": served.task_queue} in [
                {k: labels[k] for k in ("namespace", "task_queue")} for labels in granted
            ], granted
            temporal = [(name, labels) for name, labels, _ in samples if name.startswith("temporal_")]
            assert temporal, "no temporal_* runtime metric on the endpoint"
            # The same two labels name the same worker in Temporal's metrics: they join.
            assert any(
                labels.get("namespace") == served.namespace and labels.get("task_queue") == served.task_queue
                for _, labels in temporal
            ), temporal[:20]

        await assert_eventually(both_kinds, timeout=30, interval=0.5, message="both kinds of metrics are served")

    with pytest.raises(httpx.TransportError):  # the endpoint stops with the worker
        await _samples(address)


async def test_temporal_runtime_metrics_can_be_left_out(settings: AgentLeaseSettings) -> None:
    address = _free_address()
    served = settings.model_copy(
        update={"metrics_address": address, "migrate_on_start": True, "temporal_metrics": False}
    )
    async with running_worker(served, identity="lease-metrics-only"):
        names = {name for name, _, _ in await _samples(address)}
    assert not any(name.startswith("temporal_") for name in names), sorted(names)[:20]
    assert any(name.startswith("agentlease_") for name in names)
