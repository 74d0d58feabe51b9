"""Tools get only the settings they need (finding 7): a tool reading the ledger URL is refused and
dead-lettered with the reason, never handed the ledger password; a tool that declares its settings
reads only those, and its credential comes from its own secrets, not the worker's keyring."""

from __future__ import annotations

import uuid

import pytest

from agentlease.enums import TaskStatus
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.runtime.temporal import connect
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(120)


@pytest.mark.postgres
async def test_a_tool_cannot_read_the_ledger_url(settings: AgentLeaseSettings, pg_url: str) -> None:
    ledger_url = pg_url.replace("postgresql://postgres@", "postgresql://postgres:ledger-pw-77@")
    settings = settings.model_copy(update={"ledger_url": ledger_url})
    registry = load_registry(["tests.security.edge_tools"])
    client = await connect(settings)
    run_id = f"secrets-{uuid.uuid4().hex[:8]}"
    plan = AgentRunPlan(
        agent_run_id=run_id,
        steps=[
            PlanStep(step_id="peek", tool="read_setting", arguments={"name": "ledger_url"}),
            PlanStep(step_id="fine", tool="read_setting", arguments={"name": "http_base_url"}),
        ],
    )
    async with opened_ledger(settings) as ledger, build_worker(client, ledger, registry, settings, identity="w-sec"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

        async def peek_ended() -> RunStatus:
            status = await handle.query("status", result_type=RunStatus)
            assert status.tasks[0].status in (TaskStatus.DEAD_LETTERED, TaskStatus.SETTLED), status
            return status

        status = await assert_eventually(peek_ended, timeout=60, message="the peeking step ended")
        [peek] = [t for t in await ledger.list_tasks(run_id) if t.step_id == "peek"]
        assert peek.status is TaskStatus.DEAD_LETTERED, peek
        assert peek.last_error is not None
        assert "tool 'read_setting' may not read setting 'ledger_url'" in peek.last_error
        assert "ledger-pw-77" not in status.model_dump_json()


async def test_declared_settings_and_own_secrets(settings: AgentLeaseSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEASE_SECRET_SCOPED_CLIENT__API_TOKEN", "tok-xyz")
    monkeypatch.setenv("AGENTLEASE_SECRET_READ_SETTING__API_TOKEN", "not-for-scoped-client")
    settings = settings.model_copy(update={"publish_base_url": "http://publishing.test/", "http_base_url": "http://x/"})
    registry = load_registry(["tests.security.edge_tools", "tests.security.edge_scoped_tools"])
    client = await connect(settings)
    run_id = f"scoped-{uuid.uuid4().hex[:8]}"
    plan = AgentRunPlan(
        agent_run_id=run_id,
        steps=[
            PlanStep(step_id="own", tool="scoped_client", arguments={"name": ""}),
            PlanStep(step_id="undeclared", tool="scoped_client", arguments={"name": "http_base_url"}),
        ],
    )
    async with opened_ledger(settings) as ledger, build_worker(client, ledger, registry, settings, identity="w-sc"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

        async def both_ended() -> RunStatus:
            status = await handle.query("status", result_type=RunStatus)
            assert [t.status for t in status.tasks] == [TaskStatus.SETTLED, TaskStatus.DEAD_LETTERED], status
            return status

        status = await assert_eventually(both_ended, timeout=60, message="both steps ended")
        own = status.tasks[0].receipt
        assert own is not None and own.status == "authorized" and own.details == {"token_chars": 7}
        [undeclared] = [t for t in await ledger.list_tasks(run_id) if t.step_id == "undeclared"]
        assert undeclared.last_error is not None
        assert "not among the settings it declares (publish_base_url)" in undeclared.last_error


def test_a_tool_gets_only_its_own_secrets() -> None:
    from agentlease.errors import CredentialToolError
    from agentlease.security.secrets import EnvSecretProvider, ToolSecrets, ToolSettings

    provider = EnvSecretProvider({"AGENTLEASE_SECRET_MAILER__SMTP_PASSWORD": "pw"})
    assert ToolSecrets(provider, "mailer").get("smtp_password") == "pw"
    with pytest.raises(CredentialToolError, match="set AGENTLEASE_SECRET_PUBLISHER__SMTP_PASSWORD"):
        ToolSecrets(provider, "publisher").get("smtp_password")  # another tool's secret is not its own
    view = ToolSettings(AgentLeaseSettings(ledger_url="postgresql://u:pw@db/l", smtp_port=2525), "mailer")
    assert view.smtp_port == 2525
    for hidden in ("ledger_url", "codec_keys", "temporal_api_key", "operator_keys"):
        with pytest.raises(AttributeError, match=f"may not read setting '{hidden}'"):
            getattr(view, hidden)
    assert "pw" not in repr(view)
