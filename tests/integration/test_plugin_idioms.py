"""``AgentLeasePlugin`` does a team's worker set-up as the frameworks' plugins do (issue 17).

- On a stock ``temporal server start-dev`` (no search attribute registered), a worker given only
  ``AgentLeasePlugin`` (and, from the client, ``PydanticAIPlugin``) completes a Pydantic AI agent run
  whose workflow has no set-up line of its own, and its ``status`` query and decision updates
  answer from the start.
- A ledger that needs migrating stops the worker as it starts, with one line, however it is run.
- A team's own activity named as a leased tool is refused with one line; the built-ins and
  ``AgentRunWorkflow`` are opt-in, so a team's own ``http_get`` is not in the way.
- The worker sends each heartbeat within a second, whatever a call's heartbeat timeout (an operator may
  shorten it under the call); a worker set lower keeps its own setting.
- The recorded histories replay with the plugin's interceptor installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():  # this module holds a workflow: the sandbox imports it too
    import pytest
    from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from temporalio.client import Client, WorkflowHistory, WorkflowUpdateFailedError
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Replayer, Worker

    from agentlease.demo.agents.openai_agent import RestockAgent
    from agentlease.demo.agents.openai_agent import scripted_model_plugin as openai_scripted_model_plugin
    from agentlease.demo.agents.pydantic_ai_agent import RestockAgentWorkflow
    from agentlease.errors import ConfigurationError, LedgerUnavailableError
    from agentlease.ledger.migrate import upgrade
    from agentlease.ledger.store import Ledger
    from agentlease.observability import search_attributes
    from agentlease.plugin import AgentLeasePlugin, _pass_through
    from agentlease.pydantic_ai import LeasedToolset, run_agent
    from agentlease.records import RunStatus
    from agentlease.runtime.devserver import DEV_SERVER_STARTUP, temporal_binary
    from agentlease.runtime.names import STATUS_QUERY
    from agentlease.settings import AgentLeaseSettings
    from agentlease.workflow._interceptor import LeasedCallsInterceptor
    from agentlease.workflow._plan import AgentRunWorkflow
    from tests.eventually import assert_eventually
    from tests.integration import tools
    from tests.integration.openai_workflows import KeyedNotesAgent
    from tests.integration.pydantic_ai_agents import ScriptedAgentWorkflow

pytestmark = pytest.mark.timeout(120)


def histories() -> Path:
    """``tests/histories`` (not at import: the workflow sandbox imports this module, and refuses ``resolve``)."""
    return Path(__file__).resolve().parents[1] / "histories"


def _call_quick_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: call ``quick`` once, then answer with the number of messages it saw."""
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("quick", {})])
    return ModelResponse(parts=[TextPart(f"done after {len(messages)} messages")])


TOOLSET = LeasedToolset([tools.quick])
idiom_agent = Agent(
    FunctionModel(_call_quick_then_answer, model_name="idiom"),
    name="idiom_agent",
    toolsets=[TOOLSET],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name="IdiomAgentWorkflow")
class IdiomAgentWorkflow(PydanticAIWorkflow):
    """A team's agent workflow as it was before agentlease, its tool leased: no ``leased_calls()``
    line. It waits for ``go`` first, so that a test asks its ``status`` before any leased call."""

    __pydantic_ai_agents__ = [idiom_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    def __init__(self) -> None:
        self.go = False

    @workflow.signal
    def proceed(self) -> None:
        self.go = True

    @workflow.run
    async def run(self, prompt: str) -> str:
        await workflow.wait_condition(lambda: self.go)
        return (await run_agent(idiom_agent, prompt)).output


@workflow.defn(name="PlainRunAgentWorkflow")
class PlainRunAgentWorkflow(PydanticAIWorkflow):
    """The same agent run with Pydantic AI's own ``agent.run``: no agentlease call in the workflow at all."""

    __pydantic_ai_agents__ = [idiom_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await idiom_agent.run(prompt)).output


@asynccontextmanager
async def stock_dev_server() -> AsyncIterator[WorkflowEnvironment]:
    """``temporal server start-dev`` as a team starts it: no search attribute registered
    (``tests/integration/temporal_server.py`` registers agentlease's; this does not)."""
    env = await WorkflowEnvironment.start_local(
        ip="127.0.0.1",
        dev_server_existing_path=temporal_binary(),
        dev_server_log_level="error",
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
    )
    try:
        yield env
    finally:
        await env.shutdown()


def team_settings(address: str, ledger_url: str, **changes: Any) -> AgentLeaseSettings:
    return AgentLeaseSettings(
        temporal_address=address,
        task_queue=f"idioms-{uuid.uuid4().hex[:12]}",
        ledger_url=ledger_url,
        tool_modules=[],
        shutdown_grace=2,
        **changes,
    )


async def test_a_stock_dev_server_runs_a_framework_agent_with_only_the_plugin(sqlite_url: str) -> None:
    async with stock_dev_server() as env:
        address = env.client.service_client.config.target_host
        settings = team_settings(address, sqlite_url, migrate_on_start=True)
        client = await Client.connect(address, plugins=[PydanticAIPlugin()])
        listed = await search_attributes.missing_on(client, client.namespace)
        assert listed == sorted(key.name for key in search_attributes.ALL), "the server starts without them"
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[IdiomAgentWorkflow],
            plugins=[AgentLeasePlugin(settings=settings, tools=[tools.quick])],
        )
        async with worker:
            run_id = f"idiom-{uuid.uuid4().hex[:8]}"
            handle = await client.start_workflow(
                IdiomAgentWorkflow.run, "restock", id=run_id, task_queue=settings.task_queue
            )
            # Before any leased call: the query and the updates answer (the workflow set up nothing).
            before = await handle.query(STATUS_QUERY, result_type=RunStatus)
            assert (before.agent_run_id, before.status.value, before.tasks) == (run_id, "starting", [])
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update("approve", {"step_id": "x", "by": "alice", "reason": "r"})
            assert "has made no leased call yet" in str(refused.value.cause)

            await handle.signal(IdiomAgentWorkflow.proceed)
            assert (await asyncio.wait_for(handle.result(), 60)).startswith("done after")

            after = await handle.query(STATUS_QUERY, result_type=RunStatus)
            assert after.status.value == "completed"
            assert [(t.tool, t.status.value) for t in after.tasks] == [("quick", "settled")]

            async def shows_completed() -> None:
                described = await handle.describe()
                assert described.typed_search_attributes.get(search_attributes.RUN_STATUS) == "completed"

            await assert_eventually(shows_completed, timeout=20, message="AgentLeaseStatus completed")

            # The operator's commands know the finished framework run (its result is the agent's answer).
            shell = {"AGENTLEASE_TEMPORAL_ADDRESS": address, "AGENTLEASE_LEDGER_URL": sqlite_url}
            code, out, err = await agentlease("status", run_id, "--json", env=shell)
            assert code == 0 and not err, err
            shown = json.loads(out)
            assert (shown["status"], [(t["tool"], t["status"]) for t in shown["tasks"]]) == (
                "completed",
                [("quick", "settled")],
            )
            code, out, err = await agentlease("tasks", "--run", run_id, "--json", env=shell)
            assert code == 0 and [(t["tool"], t["status"]) for t in json.loads(out)] == [("quick", "settled")], err
            code, out, err = await agentlease("waiting", "--json", env=shell)
            assert (code, json.loads(out)) == (0, []), err
        assert await search_attributes.missing_on(client, client.namespace) == []


async def agentlease(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """The console script as an operator runs it, without blocking the event loop of the test's worker
    (which answers the command's queries)."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "agentlease"),
        *args,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("AGENTLEASE_")}, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_run_that_returns_ends_its_leased_calls_without_run_agent(
    client: Client, settings: AgentLeaseSettings
) -> None:
    pydantic_client = await Client.connect(client.service_client.config.target_host, plugins=[PydanticAIPlugin()])
    settings = settings.model_copy(update={"migrate_on_start": True})
    worker = Worker(
        pydantic_client,
        task_queue=settings.task_queue,
        workflows=[PlainRunAgentWorkflow],
        plugins=[AgentLeasePlugin(settings=settings, tools=[tools.quick])],
    )
    async with worker:
        handle = await pydantic_client.start_workflow(
            PlainRunAgentWorkflow.run, "restock", id=f"plain-{uuid.uuid4().hex[:8]}", task_queue=settings.task_queue
        )
        assert (await asyncio.wait_for(handle.result(), 60)).startswith("done after")
        status = await handle.query(STATUS_QUERY, result_type=RunStatus)
        assert (status.status.value, [t.status.value for t in status.tasks]) == ("completed", ["settled"])
        described = await handle.describe()
        assert described.typed_search_attributes.get(search_attributes.RUN_STATUS) == "completed"


async def test_a_ledger_that_needs_migrating_stops_the_worker_as_it_starts(
    client: Client, temporal_address: str, sqlite_url: str
) -> None:
    ledger = Ledger.from_url(sqlite_url)
    try:
        await upgrade(ledger.database, "0001")  # a ledger of an older version
    finally:
        await ledger.close()
    settings = team_settings(temporal_address, sqlite_url)
    worker = Worker(client, task_queue=settings.task_queue, plugins=[AgentLeasePlugin(settings=settings, tools=[])])
    reached_the_end = False
    with pytest.raises(LedgerUnavailableError) as raised:
        async with asyncio.timeout(30):  # a guard only: the block ends at once, or the test fails
            async with worker:
                await asyncio.Event().wait()  # never set: only the worker's failure ends the block
                reached_the_end = True
    assert not reached_the_end
    message = str(raised.value)
    assert "\n" not in message and "agentlease db upgrade" in message, message

    again = Worker(client, task_queue=settings.task_queue, plugins=[AgentLeasePlugin(settings=settings, tools=[])])
    with pytest.raises(LedgerUnavailableError):
        async with asyncio.timeout(30):
            await again.run()


@activity.defn(name="quick")
async def old_quick() -> str:
    """A team's own activity kept beside its leased version (same name)."""
    return "old"


@activity.defn(name="http_get")
async def own_http_get(url: str) -> str:
    """A team's own activity that happens to share a built-in tool's name."""
    return url


def test_a_team_activity_named_as_a_leased_tool_is_refused_in_one_line(
    client: Client, settings: AgentLeaseSettings
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Worker(
            client,
            task_queue=settings.task_queue,
            activities=[old_quick],
            plugins=[AgentLeasePlugin(settings=settings, tools=[tools.quick])],
        )
    message = str(raised.value)
    assert "\n" not in message and "'quick'" in message and "activities=[...]" in message, message


@pytest.mark.parametrize(
    ("given", "applied"),
    [(None, timedelta(seconds=1)), (timedelta(minutes=1), timedelta(seconds=1)), (timedelta(seconds=0.5), None)],
)
def test_the_plugin_caps_the_heartbeat_throttle(
    client: Client, settings: AgentLeaseSettings, given: timedelta | None, applied: timedelta | None
) -> None:
    """Each renewal's heartbeat reaches Temporal within a second (``docs/recovery.md``)."""
    extra: dict[str, Any] = {} if given is None else {"max_heartbeat_throttle_interval": given}
    plugin = AgentLeasePlugin(settings=settings, tools=[tools.quick])
    worker = Worker(client, task_queue=settings.task_queue, plugins=[plugin], **extra)
    assert worker.config(active_config=True).get("max_heartbeat_throttle_interval") == (applied or given)


def test_the_plugin_applies_the_poll_and_sticky_settings_to_a_worker_left_at_temporals_defaults(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """A team's worker built with the plugin kept Temporal's 5 activity polls: a paused worker's open polls took
    retries of a leased call, each for a lease TTL (``docs/ttl.md``), and used up its attempts. A worker that sets
    its own keeps them."""
    from temporalio.worker import PollerBehaviorSimpleMaximum

    settings = settings.model_copy(update={"activity_pollers": 1, "sticky_schedule_to_start": timedelta(seconds=3)})
    plain = Worker(client, task_queue=settings.task_queue, plugins=[AgentLeasePlugin(settings=settings, tools=[])])
    applied = plain.config(active_config=True)
    assert applied.get("activity_task_poller_behavior") == PollerBehaviorSimpleMaximum(1)
    assert applied.get("workflow_task_poller_behavior") == PollerBehaviorSimpleMaximum(settings.workflow_pollers)
    assert applied.get("sticky_queue_schedule_to_start_timeout") == timedelta(seconds=3)
    own = Worker(
        client,
        task_queue=f"{settings.task_queue}-own",
        plugins=[AgentLeasePlugin(settings=settings, tools=[])],
        activity_task_poller_behavior=PollerBehaviorSimpleMaximum(3),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=7),
    )
    kept = own.config(active_config=True)
    assert kept.get("activity_task_poller_behavior") == PollerBehaviorSimpleMaximum(3)
    assert kept.get("sticky_queue_schedule_to_start_timeout") == timedelta(seconds=7)


async def test_builtins_and_the_plan_workflow_are_opt_in(client: Client, settings: AgentLeaseSettings) -> None:
    team = Worker(
        client,
        task_queue=settings.task_queue,
        activities=[own_http_get],
        plugins=[AgentLeasePlugin(settings=settings, tools=[tools.quick])],
    )
    config = team.config(active_config=True)
    names = {defn.name for defn in map(activity._Definition.must_from_callable, config.get("activities", []))}
    assert {"http_get", "quick", "agentlease.apply_decision"} <= names
    assert AgentRunWorkflow not in config.get("workflows", [])

    full = Worker(
        client,
        task_queue=f"{settings.task_queue}-full",
        plugins=[AgentLeasePlugin(settings=settings, tools=[], builtins=True, agent_run_workflow=True)],
    )
    full_names = {a.__temporal_activity_definition.name for a in full.config(active_config=True).get("activities", [])}  # type: ignore[attr-defined]
    assert {"http_get", "sql_upsert", "http_publish", "smtp_send"} <= full_names
    assert AgentRunWorkflow in full.config(active_config=True).get("workflows", [])


def _history(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(f"recorded-{name}", (histories() / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("names", "replayer"),
    [
        (
            ("settled", "decisions", "cancelled"),
            lambda intercepted: Replayer(
                workflows=[AgentRunWorkflow],
                data_converter=pydantic_data_converter,
                workflow_runner=_pass_through(None),
                interceptors=[LeasedCallsInterceptor()] if intercepted else [],
            ),
        ),
        (
            ("pydantic_ai_restock", "pydantic_ai_retry_prompts", "pydantic_ai_decisions", "pydantic_ai_cancelled"),
            lambda intercepted: Replayer(
                workflows=[RestockAgentWorkflow, ScriptedAgentWorkflow],
                plugins=[PydanticAIPlugin()],
                interceptors=[LeasedCallsInterceptor()] if intercepted else [],
            ),
        ),
        (
            ("openai_restock", "openai_keyed", "openai_approved", "openai_rejected", "openai_bad_input"),
            lambda intercepted: Replayer(
                workflows=[RestockAgent, KeyedNotesAgent],
                plugins=[openai_scripted_model_plugin()],
                interceptors=[LeasedCallsInterceptor()] if intercepted else [],
            ),
        ),
    ],
    ids=["plans", "pydantic_ai", "openai"],
)
async def test_recorded_histories_replay_with_the_interceptor(names: tuple[str, ...], replayer: Any) -> None:
    """Each recorded history replays with the interceptor as it does without it (``test_replay.py``
    and the framework tests hold that it replays at all): the interceptor issues no command."""
    for name in names:
        history = _history(name)
        plain = await replayer(False).replay_workflow(history, raise_on_replay_failure=False)
        intercepted = await replayer(True).replay_workflow(history, raise_on_replay_failure=False)
        assert str(intercepted.replay_failure) == str(plain.replay_failure), name


def test_every_recorded_history_is_replayed_here() -> None:
    kept = {path.stem for path in histories().glob("*.json")}
    assert kept == {
        "settled",
        "decisions",
        "cancelled",
        "pydantic_ai_restock",
        "pydantic_ai_retry_prompts",
        "pydantic_ai_decisions",
        "pydantic_ai_cancelled",
        "openai_restock",
        "openai_keyed",
        "openai_approved",
        "openai_rejected",
        "openai_bad_input",
    }, json.dumps(sorted(kept))
