"""``http_get`` fetches only under its base URL and from allowed hosts, on a real worker.

A refused URL is a permanent tool error: the step is dead-lettered with the reason, and nothing is
fetched (``docs/security-input.md``, "Tool authority").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client

from agentlease.demo.downstream import Downstream, running_downstream
from agentlease.enums import EventKind, TaskStatus
from agentlease.records import task_id_for
from agentlease.settings import AgentLeaseSettings
from tests.integration.conftest import client, settings  # noqa: F401
from tests.integration.test_builtin_tools import serving

from .tool_runs import start_step, step_ends

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def downstream(tmp_path: Path) -> AsyncIterator[Downstream]:
    async with running_downstream(tmp_path / "downstream") as running:
        yield running


@pytest.fixture
def http_settings(settings: AgentLeaseSettings, downstream: Downstream) -> AgentLeaseSettings:  # noqa: F811
    """The base URL is the example file server's ``/files/`` path."""
    return settings.model_copy(update={"http_base_url": f"{downstream.http_base_url.rstrip('/')}/files/"})


async def _refused(client: Client, settings: AgentLeaseSettings, url: str) -> str:  # noqa: F811
    async with serving(client, settings, "worker-http") as ledger:
        handle = await start_step(client, settings, "http_get", {"url": url})
        view = await step_ends(handle, TaskStatus.DEAD_LETTERED, TaskStatus.SETTLED)
        record = await ledger.get_task(task_id_for(handle.id, "s"))
        events = await ledger.events(record.task_id)
        await handle.terminate("test over")
    assert view.status == TaskStatus.DEAD_LETTERED, view
    assert record.status == TaskStatus.DEAD_LETTERED and record.attempts == 1, record
    assert record.last_error is not None and "refused to fetch" in record.last_error, record
    assert not any(e.kind == EventKind.SETTLED for e in events)
    return record.last_error


async def test_a_relative_url_cannot_climb_out_of_the_base_path(
    client: Client,  # noqa: F811
    http_settings: AgentLeaseSettings,
) -> None:
    reason = await _refused(client, http_settings, "../admin")
    assert "outside the base path /files/" in reason


async def test_a_percent_encoded_dot_dot_is_refused(client: Client, http_settings: AgentLeaseSettings) -> None:  # noqa: F811
    reason = await _refused(client, http_settings, "..%2fadmin")
    assert "'..' segment" in reason


async def test_a_scheme_relative_url_cannot_reach_another_host(
    client: Client,  # noqa: F811
    http_settings: AgentLeaseSettings,
) -> None:
    reason = await _refused(client, http_settings, "//other.host/x")
    assert "other.host:80 is not the host of AGENTLEASE_HTTP_BASE_URL" in reason


async def test_an_absolute_url_of_another_host_is_refused(
    client: Client,  # noqa: F811
    http_settings: AgentLeaseSettings,
    downstream: Downstream,
) -> None:
    # The publishing service runs on the same machine, another port: another origin.
    reason = await _refused(client, http_settings, f"{downstream.publish_base_url}posts")
    assert "is not the host of AGENTLEASE_HTTP_BASE_URL" in reason


async def test_the_cloud_metadata_address_is_refused(client: Client, http_settings: AgentLeaseSettings) -> None:  # noqa: F811
    reason = await _refused(client, http_settings, "http://169.254.169.254/latest/meta-data/")
    assert "169.254.169.254:80 is not the host" in reason
    assert "AGENTLEASE_HTTP_ALLOWED_HOSTS" in reason


async def test_credentials_in_a_url_are_refused_and_not_recorded(
    client: Client,  # noqa: F811
    http_settings: AgentLeaseSettings,
) -> None:
    reason = await _refused(client, http_settings, "http://admin:hunter2@169.254.169.254/")
    assert "hunter2" not in reason


async def test_the_base_path_is_fetched(client: Client, http_settings: AgentLeaseSettings) -> None:  # noqa: F811
    async with serving(client, http_settings, "worker-http"):
        handle = await start_step(client, http_settings, "http_get", {"url": "runbook.md"})
        result = await handle.result()
    [view] = result.tasks
    assert view.status == TaskStatus.SETTLED and view.receipt is not None, view
    assert view.receipt.external_id.endswith("/files/runbook.md")


async def test_an_allowed_host_is_fetched(
    client: Client,  # noqa: F811
    http_settings: AgentLeaseSettings,
    downstream: Downstream,
) -> None:
    origin = downstream.publish_base_url.split("//", 1)[1].split("/", 1)[0]
    allowed = http_settings.model_copy(update={"http_allowed_hosts": [origin]})
    async with serving(client, allowed, "worker-http"):
        handle = await start_step(
            client, allowed, "http_get", {"url": f"{downstream.publish_base_url}posts?idempotency_key=none"}
        )
        result = await handle.result()
    [view] = result.tasks
    assert view.status == TaskStatus.SETTLED, view
    assert view.receipt is not None and view.receipt.details["status_code"] == 200, view
